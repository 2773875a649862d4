#!/usr/bin/env bash
# Goal: the dependency direction of STYLE §1 holds. src/ never includes model/ or sim/;
# model/ includes only src/core from src/; src/core includes nothing else of ours.
# Method: grep the include lines; any hit fails with the offending lines.
set -u
root=${1:-.}
cd "$root" || exit 2
fail=0
report() { echo "layering: $1"; echo "$2"; fail=1; }
hits=$(grep -rnE '#include +"(model|sim|fuzz|tests|bench)/' src)
[ -n "$hits" ] && report "src/ includes a higher layer" "$hits"
hits=$(grep -rnE '#include +"src/' model | grep -v '"src/core/')
[ -n "$hits" ] && report "model/ includes cache code (only src/core is allowed)" "$hits"
hits=$(grep -rnE '#include +"(model|sim)/' model | grep -v '"model/')
[ -n "$hits" ] && report "model/ includes sim/" "$hits"
hits=$(grep -rnE '#include +"' src/core | grep -v '"src/core/')
[ -n "$hits" ] && report "src/core includes something outside src/core" "$hits"
hits=$(grep -rnE '#include +[<"](nlohmann|CLI|fmt|gtest|rapidcheck)' src model)
[ -n "$hits" ] && report "src/ or model/ uses a library reserved for sim/ and tests/" "$hits"
hits=$(grep -rnE '#include +[<"](gtest|rapidcheck|gmock)' sim)
[ -n "$hits" ] && report "sim/ depends on a test framework" "$hits"
[ $fail -eq 0 ] && echo "layering: ok"
exit $fail
