#!/usr/bin/env bash
# idemgate chaos between `idemgate serve` and a downstream (docs/verify.md, "The chaos proxy").
#
#   agent (curl) → idemgate serve → idemgate chaos → json-server (a ticket service, from npm)
#
# json-server makes a new ticket for every POST and knows nothing of idempotency keys, so the
# honest contract (examples/chaos/tickets.create.yaml) says so: no deduplication, no receipt
# lookup. The proxy drops 30 % of the answers after json-server committed, and answers 10 %
# with a 502. idemgate never sends a maybe-sent request again to a downstream that does not
# deduplicate: those operations end `unknown`, and json-server holds exactly one ticket per
# operation that reached it. Run with LIE=1 and the contract claims deduplication: idemgate
# then resends after every lost answer, json-server makes a second ticket, and the proxy
# exits 1 naming each key that committed twice.
#
# Needs: curl, python3, node with npm (json-server is installed once into
# $HOME/.cache/idemgate-npm-json-server), and the idemgate binary (IDEMGATE_BIN, else built
# with cargo). DOWNSTREAM_URL points the proxy at a ticket service of your own instead (its
# POST /tickets must answer the ticket's id at `/id`). Exits with the proxy's status.
set -euo pipefail
cd "$(dirname "$0")/../.."

target="${CARGO_TARGET_DIR:-target}"
bin="${IDEMGATE_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --quiet -p idemgate-cli
  bin="$target/debug/idemgate"
fi
operations="${OPERATIONS:-20}"
lie="${LIE:-0}"

work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
wait_for() { for _ in $(seq 1 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done; echo "no answer from $1" >&2; exit 2; }

# 1. The downstream.
downstream="${DOWNSTREAM_URL:-}"
if [ -z "$downstream" ]; then
  prefix="$HOME/.cache/idemgate-npm-json-server"
  json_server="$prefix/node_modules/.bin/json-server"
  if [ ! -x "$json_server" ]; then
    mkdir -p "$prefix"
    timeout 300 npm install --no-audit --no-fund --silent --prefix "$prefix" json-server@0.17.4
  fi
  js_port="$(port)"
  echo '{"tickets": []}' > "$work/db.json"
  "$json_server" --host 127.0.0.1 --port "$js_port" --quiet "$work/db.json" > "$work/json-server.log" 2>&1 &
  pids+=("$!")
  downstream="http://127.0.0.1:$js_port"
  wait_for "$downstream/tickets"
fi

# 2. The proxy in front of it: seeded, so a run replays.
chaos_port="$(port)"
"$bin" chaos --upstream "$downstream" --listen "127.0.0.1:$chaos_port" --reference /id \
  --seed 7 --drop 0.3 --error 0.1 --ledger "$work/ledger.json" > "$work/chaos.out" 2> "$work/chaos.err" &
chaos_pid=$!
pids+=("$chaos_pid")
for _ in $(seq 1 100); do grep -q '^listening on ' "$work/chaos.out" 2>/dev/null && break; sleep 0.1; done

# 3. The gateway, its one tool's effect pointed at the proxy.
dedup=false
[ "$lie" = 1 ] && dedup=true
sed -e "s|http://127.0.0.1:7070|http://127.0.0.1:$chaos_port|" \
    -e "s|deduplicates_by_key: false|deduplicates_by_key: $dedup|" \
    examples/chaos/tickets.create.yaml > "$work/tickets.create.yaml"
gate_port="$(port)"
token="idg_chaos_example_agent"
cat > "$work/gate.toml" <<TOML
listen = "127.0.0.1:$gate_port"
environment = "example"
store = "sqlite://$work/gate.sqlite"
contracts = ["$work/tickets.create.yaml"]
sandbox = false

[[tenants]]
name = "acme"
[[tenants.tokens]]
name = "agent"
sha256 = "$(printf %s "$token" | sha256sum | cut -d' ' -f1)"
role = "agent"
TOML
"$bin" serve --config "$work/gate.toml" > "$work/serve.log" 2>&1 &
pids+=("$!")
gateway="http://127.0.0.1:$gate_port"
wait_for "$gateway/healthz"

# 4. The agent: every operation delivered twice, as a retry after a lost answer would.
declare -A labels=()
for round in 1 2; do
  for i in $(seq 1 "$operations"); do
    label="$(curl -s "$gateway/v1/tools/tickets.create/invoke" \
      -H "Authorization: Bearer $token" -H "Idempotency-Key: \"run-$i:open\"" \
      -d "{\"arguments\": {\"subject\": \"ticket $i\"}}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["outcome"])')"
    labels[$label]=$(( ${labels[$label]:-0} + 1 ))
  done
done
echo "idemgate answered: $(for l in "${!labels[@]}"; do printf '%s %s  ' "$l" "${labels[$l]}"; done)"

# 5. Stop the proxy: its summary, and its exit status.
kill -INT "$chaos_pid"
status=0
wait "$chaos_pid" || status=$?
sed -n '3,$p' "$work/chaos.out"
tickets="$(curl -s "$downstream/tickets" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')"
references="$(python3 -c 'import json,sys; print(sum(len(k["references"]) for k in json.load(open(sys.argv[1]))["keys"]))' "$work/ledger.json")"
echo "the downstream holds $tickets tickets; the ledger saw $references distinct effects"
if [ -z "${DOWNSTREAM_URL:-}" ] && [ "$tickets" != "$references" ]; then
  echo "the ledger and the downstream disagree" >&2
  exit 2
fi
exit "$status"
