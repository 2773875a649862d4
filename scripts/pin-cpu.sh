# Sourced by the benchmark scripts: sets the array `pin` to a command prefix that runs a
# process on one CPU, the first this shell may use (empty where taskset is missing). On this
# 2-core VM one core ran the same replay 1.4-1.5x slower than the other, steadily, so an
# unpinned benchmark measured which core its process landed on.
pin=()
if command -v taskset >/dev/null; then
  pin=(taskset -c "$(taskset -cp $$ | sed 's/.*: *//; s/[-,].*//')")
fi
