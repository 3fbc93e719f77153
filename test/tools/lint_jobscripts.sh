#!/usr/bin/env bash
# Every jobscript under jobscripts/ (and the test drivers' shell) parses with `bash -n`, is
# executable and passes shellcheck. Skipped (77) where shellcheck is not installed (after
# the bash -n pass, which needs nothing).
set -euo pipefail
src=${TRIDENT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
mapfile -t files < <(find "$src/jobscripts" -type f \( -name '*.sh' -o -name '*.sbatch' -o -name '*.pbs' \) | sort)
files+=("$src/test/tools/lint_jobscripts.sh")
if (( ${#files[@]} < 2 )); then
  echo "FAIL: no jobscripts under $src/jobscripts"
  exit 1
fi
fail=0
for f in "${files[@]}"; do
  if bash -n "$f"; then echo "ok   bash -n ${f#"$src"/}"; else echo "FAIL bash -n ${f#"$src"/}"; fail=1; fi
  if [[ -x $f ]]; then echo "ok   executable ${f#"$src"/}"; else echo "FAIL not executable: ${f#"$src"/}"; fail=1; fi
done
if ! command -v shellcheck >/dev/null 2>&1; then
  (( fail )) && exit 1
  echo "skipped: shellcheck is not installed (apt-get install shellcheck)"
  exit 77
fi
for f in "${files[@]}"; do
  if shellcheck --shell=bash "$f"; then echo "ok   shellcheck ${f#"$src"/}"; else echo "FAIL shellcheck ${f#"$src"/}"; fail=1; fi
done
(( fail )) && exit 1
echo "tools.lint_jobscripts: PASS (${#files[@]} scripts)"
