#!/usr/bin/env bash
# Bring up a fleet of podman systemd hosts described by an inventory and serve a model split
# across them with playbooks/site.yml; or remove that fleet.
#
#   bash scripts/demo.sh up   [INVENTORY]   (make demo      DEMO_INVENTORY=...)
#   bash scripts/demo.sh down [INVENTORY]   (make demo-down DEMO_INVENTORY=...)
#
# The inventory describes the "hardware": `demo_podman: {memory, cpus, rate, cpu_shares}` per host, and in its
# group_vars `demo_network: {name, subnet, gateway}`, `demo_image`, `demo_mirror_port`. The
# pinned llama.cpp tarball and the model are served to the hosts from an HTTP mirror on the
# network's gateway (the same URL code path a real fleet uses): a container of its own
# (<network>-mirror, on the host's network), which lives and goes with the fleet, so that the
# README's playbooks (plan, site, tune, verify) work on the demo fleet as printed. The inventory's
# llmfleet_output_dir is the demo's own directory (.cache/demo/<inventory>/out), where site.yml
# writes the fleet's plan and tune.yml finds it. The fleet is left running with lines saying how
# to talk to it and how to tune it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=/dev/null
source scripts/env.sh

action=${1:-}
inventory=${2:-inventories/demo}
case $action in up | down) ;; *)
  echo "usage: $0 up|down [INVENTORY]" >&2
  exit 2
  ;;
esac
[[ -d $inventory || -f $inventory ]] || {
  echo "demo: no inventory at $inventory" >&2
  exit 2
}
state=$CACHE/demo/$(basename "$(cd "$(dirname "$inventory")" && pwd)/$(basename "$inventory")")
mkdir -p "$state"

# Read the fleet's description once: one "key value..." line per fact.
ansible-inventory -i "$inventory" --list >"$state/inventory.json"
spec=$(
  python3 - "$state/inventory.json" <<'EOF'
import json, sys
inv = json.load(open(sys.argv[1]))
hv = inv.get("_meta", {}).get("hostvars", {})
def hosts(group):
    return inv.get(group, {}).get("hosts", [])
heads, workers = hosts("llm_head"), hosts("llm_workers")
if len(heads) != 1 or not workers:
    sys.exit(f"demo: the inventory needs exactly one llm_head host and llm_workers (got {heads}, {workers})")
any_vars = hv[heads[0]]
net = any_vars.get("demo_network") or {}
for key in ("name", "subnet", "gateway"):
    if not net.get(key):
        sys.exit(f"demo: demo_network.{key} is not set in the inventory")
print("network", net["name"], net["subnet"], net["gateway"])
print("image", any_vars.get("demo_image", "localhost/llmfleet-host:bookworm"))
print("mirror_port", any_vars.get("demo_mirror_port", 18960))
print("output_dir", any_vars.get("llmfleet_output_dir", ""))
print("head", heads[0])
def flag(value):
    return str(value).lower() in ("true", "yes", "1")
fleet_tls = flag(any_vars.get("llmfleet_tls", False))
print("tls", "true" if fleet_tls else "false")
# WireGuard between the head and the workers (the role's defaults: on, port 51871).
tunnel = any_vars.get("llmfleet_target", "systemd") == "systemd" and flag(any_vars.get("llmfleet_wireguard", True))
print("wireguard", "true" if tunnel else "false", any_vars.get("wireguard_port", 51871))
scheme = "https" if fleet_tls or flag(any_vars.get("chat_ui_tls", False)) else "http"
prefix = "/" + str(any_vars.get("chat_ui_path_prefix", "/chat")).strip("/")
print("chat_path", scheme, any_vars.get("chat_ui_port", 8088), prefix.rstrip("/") + "/")
print("chat_user", any_vars.get("chat_ui_username", "llmfleet"))
# The model file the fleet downloads from the mirror: the last part of llmfleet_model.url.
model_url = str((any_vars.get("llmfleet_model") or {}).get("url", "SmolLM2-135M-Instruct.Q4_1.gguf"))
print("model_file", model_url.rstrip("/").rsplit("/", 1)[-1])
# demo_podman.arch (e.g. arm64): the host runs that architecture's image (demo_images[arch]) with
# podman --arch, under qemu-user on another machine; demo_podman.image (e.g. vulkan): the image
# demo_images names so (make vulkan-image: lavapipe); neither: demo_image, the machine's own.
images = any_vars.get("demo_images") or {}
for name in heads + workers:
    pod = hv[name].get("demo_podman") or {}
    arch = str(pod.get("arch") or "-")
    key = str(pod.get("image") or (arch if arch != "-" else ""))
    if key and not images.get(key):
        what = f"demo_podman.image {key}" if pod.get("image") else f"demo_podman.arch {arch}"
        sys.exit(f"demo: {name} has {what} but demo_images has no image for it (got {sorted(images)})")
    print("host", name, pod.get("memory", "512m"), pod.get("cpus", 1), pod.get("rate") or "-",
          pod.get("cpu_shares") or "-", arch, images.get(key) or any_vars.get("demo_image", "localhost/llmfleet-host:bookworm"))
# The llama.cpp flavours the inventory chooses for its hosts (llama_cpp_flavour; the probe picks the
# others): their release tarballs are mirrored too.
print("flavours", *sorted({str(hv[n]["llama_cpp_flavour"]) for n in heads + workers if hv[n].get("llama_cpp_flavour")}) or ["-"])
EOF
)
get() { awk -v k="$1" '$1 == k { $1 = ""; sub(/^ /, ""); print }' <<<"$spec"; }
read -r net_name net_subnet net_gateway <<<"$(get network)"
image=$(get image)
mirror_port=$(get mirror_port)
model_file=$(get model_file)
head=$(get head)
read -r wg_on wg_port <<<"$(get wireguard)"
mapfile -t host_lines < <(get host)

mirror=$net_name-mirror
stop_mirror() {
  if podman rm -f -t 2 "$mirror" >/dev/null 2>&1; then echo "demo: removed the mirror $mirror"; fi
}

# The inventory names the demo's directory as the fleet's output directory (the playbooks find
# the plan there without -e): refuse one that does not, before anything starts.
case $(get output_dir) in
*"/demo/$(basename "$state")/out"*) ;;
*)
  echo "demo: $inventory must set llmfleet_output_dir to the demo's directory, ending in" \
    "/demo/$(basename "$state")/out (got '$(get output_dir)'; see inventories/demo/group_vars/all/demo.yml)" >&2
  exit 2
  ;;
esac

if [[ $action == down ]]; then
  stop_mirror
  for line in "${host_lines[@]}"; do
    read -r name _ <<<"$line"
    if podman rm -f -t 5 "$name" >/dev/null 2>&1; then echo "demo: removed $name"; fi
  done
  if podman network rm "$net_name" >/dev/null 2>&1; then echo "demo: removed network $net_name"; fi
  rm -rf "$state"
  exit 0
fi

start=$(date +%s)

# demo_podman.rate (e.g. 20mbit): a tbf qdisc on the host's eth0 (its end of the veth pair; the
# container has NET_ADMIN) limits what it sends: a slow link to the head. "-": none. tbf, not
# netem: this kernel has no netem (../shared/facts/test-hosts.md, "Network shaping").
shape_link() {
  local name=$1 rate=$2
  [[ -n $rate && $rate != - ]] || return 0
  podman exec "$name" tc qdisc replace dev eth0 root tbf rate "$rate" burst 32kbit latency 400ms
  echo "demo: $name sends at most $rate (tbf on eth0)"
}

# 1. The network and one systemd container per host, with its memory and CPU limits.
if ! podman network exists "$net_name"; then
  podman network create --subnet "$net_subnet" --gateway "$net_gateway" "$net_name" >/dev/null
  echo "demo: created network $net_name ($net_subnet)"
fi
for line in "${host_lines[@]}"; do
  read -r name memory cpus rate shares arch host_image <<<"$line"
  # demo_podman.cpu_shares: the host's CPU weight against every other process of the machine
  # (default 1024), so that a host of "1 CPU" gets it while the machine is shared; "-": default.
  weight=()
  [[ -z $shares || $shares == - ]] || weight=(--cpu-shares "$shares")
  # demo_podman.arch: another architecture's image, run through qemu-user (binfmt_misc, registered
  # by scripts/host-setup.sh); "-": the machine's own.
  platform=()
  [[ $arch == - ]] || platform=(--arch "$arch")
  if podman container exists "$name"; then
    podman start "$name" >/dev/null
    [[ ${#weight[@]} -eq 0 ]] || podman update "${weight[@]}" "$name" >/dev/null
    shape_link "$name" "$rate"
    continue
  fi
  # NET_ADMIN: the role manages an nftables table inside the host (its firewall) and the
  # WireGuard interface; /dev/net/tun: wireguard-go's (this kernel has no WireGuard module).
  podman run -d --name "$name" --hostname "$name" --network "$net_name" --systemd always \
    --memory "$memory" --memory-swap "$memory" --cpus "$cpus" "${weight[@]}" "${platform[@]}" --cap-add NET_ADMIN \
    --device /dev/net/tun "$host_image" /sbin/init >/dev/null
  echo "demo: started host $name (memory $memory, cpus $cpus${platform[*]:+, ${platform[*]}})"
  shape_link "$name" "$rate"
done
for line in "${host_lines[@]}"; do
  read -r name _ <<<"$line"
  for _ in $(seq 1 60); do
    s=$(podman exec "$name" systemctl is-system-running 2>/dev/null || true)
    [[ $s == running || $s == degraded ]] && break
    sleep 0.5
  done
done

# 2. The mirror: the pinned artifacts on the network's gateway (hard links, no copies): the x86_64
# release tarball and the source, the ubuntu-arm64 one (make arm64-artifacts) when a host is arm64.
mkdir -p "$state/mirror"
mirrored=("$CACHE"/dist/llama-*-bin-ubuntu-x64.tar.gz "$CACHE"/dist/llama.cpp-*-src.tar.gz "$CACHE/models/$model_file")
if grep -q '^host .* arm64 [^ ]*$' <<<"$spec"; then
  mirrored+=("$CACHE"/dist-arm64/llama-*-bin-ubuntu-arm64.tar.gz)
fi
# A host on llama.cpp's Vulkan build (llama_cpp_flavour: ubuntu-vulkan-x64; make vulkan-artifacts).
if [[ " $(get flavours) " == *" ubuntu-vulkan-x64 "* ]]; then
  mirrored+=("$CACHE"/dist-vulkan/llama-*-bin-ubuntu-vulkan-x64.tar.gz)
fi
for f in "${mirrored[@]}"; do
  [[ -f $f ]] || {
    echo "demo: missing $f (run make test-artifacts; for an arm64 host make arm64-artifacts; for a Vulkan host make vulkan-artifacts)" >&2
    exit 1
  }
  ln -f "$f" "$state/mirror/" 2>/dev/null || cp -f "$f" "$state/mirror/"
done
# A container on the host's network (the gateway's address is the host's), which outlives this
# script as the hosts do; demo down removes it with them.
stop_mirror >/dev/null
podman run -d --name "$mirror" --network host \
  -v "$state/mirror:/srv/mirror:ro" -v "$ROOT/tests/support/http_mirror.py:/srv/http_mirror.py:ro" \
  "$image" python3 /srv/http_mirror.py /srv/mirror --port "$mirror_port" --bind "$net_gateway" >/dev/null
for _ in $(seq 1 100); do
  curl -s -o /dev/null "http://$net_gateway:$mirror_port/" && break
  sleep 0.1
done
curl -s -o /dev/null "http://$net_gateway:$mirror_port/" || {
  echo "demo: the mirror $mirror does not answer on http://$net_gateway:$mirror_port/:" >&2
  podman logs --tail 20 "$mirror" >&2 || true
  exit 1
}
echo "demo: the mirror $mirror serves the artifacts on http://$net_gateway:$mirror_port/"

# 3. site.yml: probe -> plan -> artifacts -> deploy -> verify.
site_start=$(date +%s)
if ! ansible-playbook -i "$inventory" playbooks/site.yml | tee "$state/site.log"; then
  echo "demo: site.yml failed; the log is $state/site.log" >&2
  exit 1
fi
site_time=$(($(date +%s) - site_start))
[[ -f $state/out/plan.json ]] || {
  echo "demo: site.yml wrote no $state/out/plan.json: the inventory's llmfleet_output_dir points elsewhere" >&2
  exit 1
}

# 4. The plan, a real answer, how to talk to it.
echo
echo "==== plan ($state/out/plan.md)"
cat "$state/out/plan.md" 2>/dev/null || echo "(no plan.md written)"
echo
# The question a newcomer would ask; the answer must read as one (scripts/demo-answer.py refuses an
# empty answer or one with chat-template markers in it).
question=${DEMO_QUESTION:-"Name three colours."}
echo "==== a real answer through $head"
lan_ip() { podman inspect -f "{{(index .NetworkSettings.Networks \"$net_name\").IPAddress}}" "$1"; }
# DEMO_CAPTURE=FILE (make demo-check): tcpdump on the network's bridge, head <-> workers only,
# while the answer is made, into FILE (the request is sent on the head's loopback, so that what
# crosses the bridge is the head's traffic to its workers); FILE.json says who is who.
capture_pid=""
if [[ -n ${DEMO_CAPTURE:-} ]]; then
  command -v tcpdump >/dev/null || {
    echo "demo: DEMO_CAPTURE needs tcpdump on the controller (bash scripts/host-setup.sh installs it)" >&2
    exit 1
  }
  bridge=$(podman network inspect -f '{{.NetworkInterface}}' "$net_name")
  head_lan=$(lan_ip "$head")
  worker_lans=()
  for line in "${host_lines[@]}"; do
    read -r name _ <<<"$line"
    [[ $name == "$head" ]] || worker_lans+=("$(lan_ip "$name")")
  done
  filter="host $head_lan and (host ${worker_lans[0]}$(printf ' or host %s' "${worker_lans[@]:1}"))"
  python3 -c 'import json, sys; json.dump({"bridge": sys.argv[1], "head": sys.argv[2], "workers": sys.argv[3].split(),
    "wireguard": sys.argv[4] == "true", "wireguard_port": int(sys.argv[5]), "question": sys.argv[6]}, open(sys.argv[7], "w"))' \
    "$bridge" "$head_lan" "${worker_lans[*]}" "$wg_on" "$wg_port" "$question" "$DEMO_CAPTURE.json"
  tcpdump -i "$bridge" -U -n -s 0 -w "$DEMO_CAPTURE" "$filter" 2>"$DEMO_CAPTURE.log" &
  capture_pid=$!
  sleep 1.5
fi
body=$(python3 -c 'import json, sys; print(json.dumps({"messages": [{"role": "user", "content": sys.argv[1]}],
  "max_tokens": 48, "temperature": 0}))' "$question")
if ! podman exec -i "$head" sh -c 'curl -s -m 120 http://127.0.0.1:8080/v1/chat/completions \
  -H "Authorization: Bearer $(cat /etc/llmfleet/api-key)" -H "Content-Type: application/json" -d @-' \
  <<<"$body" | python3 scripts/demo-answer.py --question "$question"; then
  echo "demo: the head gave no answer that reads as one (above)" >&2
  [[ -z $capture_pid ]] || kill "$capture_pid" 2>/dev/null || true
  exit 1
fi
if [[ -n $capture_pid ]]; then
  sleep 1
  kill "$capture_pid" 2>/dev/null || true
  wait "$capture_pid" || true
  echo "demo: captured the bridge $bridge during that answer into $DEMO_CAPTURE"
fi
if [[ $wg_on == true ]]; then
  echo "demo: the head reaches its workers through WireGuard (interface llmfleet, UDP $wg_port):"
  podman exec "$head" wg show llmfleet endpoints | sed 's/^/  peer /'
fi
head_ip=$(lan_ip "$head")
read -r chat_scheme chat_port chat_prefix <<<"$(get chat_path)"
echo
echo "demo: site.yml took ${site_time}s; demo wall time $(($(date +%s) - start))s"
echo "demo: the fleet is running. Talk to it (after 'source scripts/env.sh'):"
api_base=http://$head_ip:8080 curl_tls=""
if [[ $(get tls) == true ]]; then
  # llmfleet_tls: llama-server listens on the head's loopback; the page's TLS port relays the API.
  api_base=https://$head_ip:$chat_port curl_tls="-k "
fi
echo "  curl $curl_tls$api_base/v1/chat/completions -H \"Authorization: Bearer \$(podman exec $head cat /etc/llmfleet/api-key)\" -H 'Content-Type: application/json' -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'"
if [[ -f $state/out/chat-password ]]; then
  echo "$chat_scheme://$head_ip:$chat_port$chat_prefix" >"$state/out/chat-url"
  echo "demo: the chat page: $chat_scheme://$head_ip:$chat_port$chat_prefix (user $(get chat_user), self-signed certificate;"
  echo "  the password is in $state/out/chat-password)"
fi
echo "demo: it is a fleet like any other (its plan is $state/out/plan.json; the mirror stays up with it):"
echo "  ansible-playbook playbooks/tune.yml -i $inventory     # measure, re-plan for speed, redeploy if > 10 % faster"
echo "  ansible-playbook playbooks/plan.yml -i $inventory     # read the plan again; nothing changes"
echo "  ansible-playbook playbooks/site.yml -i $inventory     # converge it again"
echo "  ansible-playbook playbooks/verify.yml -i $inventory   # one real request, the per-host table"
if [[ $inventory == inventories/demo ]]; then
  echo "demo: remove it (and its mirror) with: make demo-down"
else
  echo "demo: remove it (and its mirror) with: make demo-down DEMO_INVENTORY=$inventory"
fi
