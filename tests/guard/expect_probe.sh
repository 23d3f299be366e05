#!/bin/sh
# expect_probe.sh EXPECT PRELOAD PATTERN COMMAND...
#   Runs COMMAND (with LD_PRELOAD=PRELOAD unless PRELOAD is "none") and passes when it ended as
#   EXPECT says (abort: killed by SIGABRT, status 134; ok: status 0) and its output matches the
#   extended regular expression PATTERN.
expect=$1 preload=$2 pattern=$3
shift 3
# shellcheck disable=SC3045  # dash and bash both have ulimit -c
ulimit -c 0 2>/dev/null  # an expected abort should not leave a core file
if [ "$preload" = none ]; then
  out=$("$@" 2>&1)
else
  out=$(LD_PRELOAD="$preload" "$@" 2>&1)
fi
status=$?
printf '%s\n' "$out"
case $expect in
  abort) want=134 ;;
  ok) want=0 ;;
  *) echo "expect_probe.sh: EXPECT must be abort or ok, not '$expect'"; exit 2 ;;
esac
if [ "$status" -ne "$want" ]; then
  echo "FAIL: exit status $status, expected $want ($expect)"
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
  echo "FAIL: output does not match /$pattern/"
  exit 1
fi
echo "PASS: $expect, output matches /$pattern/"
