#!/usr/bin/env bash
# The mutation check of docs/faults.md ("What each test catches"), reproducible: each patch here
# is one deliberate product bug, made with `git diff`, whose header names the test that should
# catch it:
#
#   # mutation: what the bug does
#   # test: the command that runs the test
#   # expect: caught | missed   (missed: a second mechanism covers it, as the table says)
#   # fails-with: text the test's output must contain when it catches the bug (its reason)
#
# Each test runs on the clean tree first (the baseline): a test that fails without its patch
# proves nothing, and its row says so. A failure counts as caught only when the log holds the
# patch's `fails-with` text (else "failed otherwise"); a test stopped by the timeout is
# reported apart ("timed out"), never as caught.
#
# For each patch (all, or those named: `tests/mutations/run.sh 01 19-health-always-200`), this
# applies it, builds the binaries, runs its test, and reverts it (always: on failure and on
# Ctrl-C too), then prints mutation → test → caught (the test failed) or MISSED (it passed).
# Slow (a build and a process-level test per patch) and it edits the working tree while it
# runs: on demand only, never in CI, on a clean checkout. Logs: target/mutations/<patch>.log.
set -euo pipefail

root="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
cd "$root"
here=tests/mutations
logs=target/mutations
mkdir -p "$logs"
# A test that a bug makes hang fails on its own bounds; this only stops a runaway.
test_timeout="${MUTATION_TEST_TIMEOUT:-1800}"

patches=()
if [ "$#" -eq 0 ]; then
    patches=("$here"/*.patch)
else
    for want in "$@"; do
        found=("$here/$want"*.patch)
        [ -e "${found[0]}" ] || { echo "no patch named $want*" >&2; exit 2; }
        patches+=("${found[@]}")
    done
fi

applied=""
revert() {
    if [ -n "$applied" ]; then
        git apply -R "$applied"
        echo "reverted $(basename "$applied")" >&2
        applied=""
    fi
}
trap revert EXIT
trap 'exit 130' INT TERM

header() { sed -n "s/^# $2: //p" "$1" | head -n 1; }

# Runs a test command into a log; prints passed, failed or timed out.
run_test() {  # COMMAND LOG
    local code=0
    timeout "$test_timeout" bash -c "$1" >>"$2" 2>&1 || code=$?
    case "$code" in
        0) echo passed ;;
        124 | 137) echo "timed out" ;;
        *) echo failed ;;
    esac
}

# The baseline: every named test on the clean tree, once each.
declare -A baseline
cargo build --workspace --bins --tests >"$logs/baseline-build.log" 2>&1
for patch in "${patches[@]}"; do
    test_cmd="$(header "$patch" test)"
    [ -n "$test_cmd" ] || { echo "$patch: no '# test:' line" >&2; exit 2; }
    [ -n "${baseline[$test_cmd]:-}" ] && continue
    baseline[$test_cmd]="$(run_test "$test_cmd" "$logs/baseline-$(basename "$patch" .patch).log")"
    echo "baseline ${baseline[$test_cmd]}: $test_cmd" >&2
done

rows=()
for patch in "${patches[@]}"; do
    name="$(basename "$patch" .patch)"
    test_cmd="$(header "$patch" test)"
    expect="$(header "$patch" expect)"
    fails_with="$(header "$patch" fails-with)"
    log="$logs/$name.log"
    git apply --check "$patch"
    git apply "$patch"
    applied="$patch"
    started=$SECONDS
    echo "== $name: $(header "$patch" mutation)" >&2
    # The features of `cargo test --workspace` (with `--bins` alone they resolve others).
    if [ "${baseline[$test_cmd]}" != passed ]; then
        outcome="baseline ${baseline[$test_cmd]}"
    elif ! cargo build --workspace --bins --tests >"$log" 2>&1; then
        outcome="build failed"
    else
        case "$(run_test "$test_cmd" "$log")" in
            passed) outcome="MISSED" ;;
            "timed out") outcome="timed out" ;;
            *) if [ -z "$fails_with" ]; then
                   outcome="caught (reason unchecked: no fails-with)"
               elif grep -qF -- "$fails_with" "$log"; then
                   outcome="caught"
               else
                   outcome="failed otherwise"
               fi ;;
        esac
    fi
    revert
    took=$((SECONDS - started))
    case "$outcome/$expect" in
        caught*/caught | MISSED/missed) verdict="as documented" ;;
        *) verdict="NOT as documented ($expect)" ;;
    esac
    row="| $name | $(header "$patch" mutation) | \`${test_cmd#cargo test }\` | $outcome | $verdict | ${took} s |"
    echo "$row" >&2
    rows+=("$row")
done

echo
echo "| patch | mutation | test | outcome | against the expectation | took |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
