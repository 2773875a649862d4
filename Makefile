# The two quick-start commands (README): `make run` and `make test`.
# Both install missing Debian packages first, then configure and build with the
# `default` CMake preset (gcc, release with always-on checks).
JOBS ?= $(shell nproc)
BUILD := build/default

.PHONY: setup configure build run test test-asan clean mutants bench coverage

setup:
	@bash scripts/setup.sh

configure: setup
	@cmake --preset default >/dev/null

build: configure
	@cmake --build --preset default -j $(JOBS)

run: build
	@$(BUILD)/sim/kvtwin run

test: build
	@ctest --preset default -j $(JOBS)

test-asan: setup
	@cmake --preset asan >/dev/null && cmake --build --preset asan -j $(JOBS) && ctest --preset asan -j $(JOBS)

clean:
	rm -rf build

# The mutant catalogue (tests/mutants/*.patch): plants each bug in a scratch copy under
# $TMPDIR (default /tmp), runs the fast gate, writes tests/mutants/RESULTS.md. A subset:
# `make mutants MUTANTS=rotating` (a substring of the patch names).
mutants: setup
	@bash scripts/mutants.sh $(MUTANTS)

# The benchmarks (`bench` preset, build/bench): the end-to-end Mooncake replay in three modes
# at block scales 1, 16 and 512, the micro benchmarks and, when built, the scaling
# benchmark; writes bench/results/latest.json and prints the table (scripts/bench.sh).
bench: setup
	@bash scripts/bench.sh

# Which lines of src/*.cc the differential checks never execute (`coverage` preset,
# build/coverage): writes build/coverage/COVERAGE.md (scripts/coverage.sh).
coverage: setup
	@bash scripts/coverage.sh
