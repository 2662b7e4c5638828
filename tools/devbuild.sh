#!/usr/bin/env bash
# Incremental rebuild of the C++ core for the editable dev install
# (pip install --no-build-isolation -Cbuild-dir=.skbuild/dev -e .), then
# copies the module where that install loads it. Serialized by a lock so
# several people can run it at once.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 9>/tmp/txc_devbuild.lock
flock 9
log=$(mktemp)
if ! cmake --build .skbuild/dev -j2 >"$log" 2>&1; then
  grep -E -A5 "error" "$log" | head -60
  echo "devbuild: build failed (full log: $log)"
  exit 1
fi
rm -f "$log"
dest=$(python -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")/torch_xla_core
# Copy then rename: processes that have the old module mapped keep their inode.
for so in .skbuild/dev/_C*.so; do
  cp "$so" "$dest/.tmp.$(basename "$so")"
  mv -f "$dest/.tmp.$(basename "$so")" "$dest/$(basename "$so")"
done
echo "devbuild: ok"
