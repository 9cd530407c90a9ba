# Sourced by count.sh and coordinator.sh: the checkout to count ($1, default this one),
# the interpreter ($PYTHON, default .venv/bin/python here), valgrind, and a scratch
# directory removed on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
code=$(cd "${1:-$root}" && pwd)
python=${PYTHON:-$root/.venv/bin/python}
command -v valgrind >/dev/null || { echo "$(basename "$0"): valgrind is not installed" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
