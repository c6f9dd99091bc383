#!/usr/bin/env bash
# The mixed fleet as a test (`make demo-mixed-check`, part of `make test`): bring up
# inventories/demo-mixed with scripts/demo.sh (an x86_64 head and worker, an arm64 worker under
# qemu-user, over WireGuard; site.yml ends with verify.yml, which fails unless every worker worked
# and carried traffic during a real request), check that no TCP crossed the bridge between the head
# and its workers (scripts/check-capture.py), then that verify's table shows each host's own
# architecture (uname -m), its own llama.cpp flavour and llama.cpp's buffers on it (the arm64 worker's
# RPC buffers named by its endpoint), and remove the fleet again unless it was already running.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=/dev/null
source scripts/env.sh

# shellcheck source=scripts/demo-fleet.sh
source scripts/demo-fleet.sh
demo_fleet demo-mixed-check "${1:-inventories/demo-mixed}"

start=$(date +%s)
mkdir -p "$state"
rm -f "$state/capture.pcap" "$state/capture.pcap.json"
DEMO_CAPTURE=$state/capture.pcap bash scripts/demo.sh up "$inventory"
python3 scripts/check-capture.py "$state/capture.pcap"

echo "demo-mixed-check: each host's uname -m (podman exec) and the table verify.yml printed ($state/out/verify.txt)"
while read -r name; do
  echo "  $name: uname -m $(podman exec "$name" uname -m)"
done < <(python3 -c 'import json, sys; inv = json.load(open(sys.argv[1]))
print("\n".join(inv["llm_head"]["hosts"] + inv["llm_workers"]["hosts"]))' "$state/inventory.json")
cat "$state/out/verify.txt"

# The table's rows against the inventory: a host with demo_podman.arch arm64 runs aarch64 and the
# ubuntu-arm64 build, the others x86_64 and ubuntu-x64; every host with layers shows its buffers.
python3 - "$state/inventory.json" "$state/out/verify.json" <<'PY'
import json, sys
inv = json.load(open(sys.argv[1]))
report = json.load(open(sys.argv[2]))["report"]
hostvars = inv["_meta"]["hostvars"]
expect = {"arm64": ("aarch64", "ubuntu-arm64"), "-": ("x86_64", "ubuntu-x64")}
rows = {row["host"]: row for row in report["rows"]}
arm64 = [h for h, hv in hostvars.items() if (hv.get("demo_podman") or {}).get("arch") == "arm64"]
assert arm64, "demo-mixed-check: the inventory has no host with demo_podman.arch arm64"
for host in inv["llm_head"]["hosts"] + inv["llm_workers"]["hosts"]:
    arch = (hostvars[host].get("demo_podman") or {}).get("arch") or "-"
    row = rows.get(host)
    assert row is not None, f"demo-mixed-check: {host} is not in verify's table"
    machine, build = expect[arch]
    assert (row.get("machine"), row.get("build")) == (machine, build), (
        f"demo-mixed-check: {host} runs {row.get('machine')} with llama.cpp {row.get('build')}, expected {machine} {build}"
    )
    if row["holds_layers"]:
        buffers = row.get("buffers_mib") or {}
        assert buffers.get("model", 0) > 0, f"demo-mixed-check: llama.cpp's buffer report names no model buffer on {host}: {buffers}"
for host in arm64:
    row = rows[host]
    assert row["role"] == "worker" and row["holds_layers"], f"demo-mixed-check: the arm64 host {host} holds no layers: {row}"
    print(f"demo-mixed-check: {host} ({row['machine']}, {row['build']}) held layers {row['layers']} with "
          f"{row['buffers_mib']} MiB of llama.cpp buffers and used {row['unit_cpu_request']:.2f} CPU s in the request")
PY
echo "demo-mixed-check: passed in $(($(date +%s) - start)) s"
