#!/usr/bin/env bash
# The detached producer protocol end to end with curl: claim a named route, submit one result,
# follow the status until the answer is delivered. Needs curl, python3 (for JSON and dates) and
# the `afterword` command (for the payload hash).
#
#   export WORK_CONTROL_CONTINUATION_TOKEN="$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
#   afterword serve --config examples/afterword.json &      # same token in its environment
#   examples/walkthrough.sh
#
# Settings (environment): AFTERWORD_URL (default http://127.0.0.1:4319), AFTERWORD_SERVICE
# (work-control), AFTERWORD_ROUTE (daily-attention), and the service's token in
# WORK_CONTROL_CONTINUATION_TOKEN (or name another variable in AFTERWORD_TOKEN_ENV).
set -euo pipefail

BASE="${AFTERWORD_URL:-http://127.0.0.1:4319}"
SERVICE="${AFTERWORD_SERVICE:-work-control}"
ROUTE="${AFTERWORD_ROUTE:-daily-attention}"
TOKEN_ENV="${AFTERWORD_TOKEN_ENV:-WORK_CONTROL_CONTINUATION_TOKEN}"
TOKEN="${!TOKEN_ENV:-}"
if [ -z "$TOKEN" ]; then
  echo "walkthrough: set $TOKEN_ENV to the detached service's token (the one afterword serve has)" >&2
  exit 2
fi

# field NAME: print one top-level field of the JSON document on stdin.
field() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
# call METHOD URL BEARER [BODY]: one request; print the body; fail with it on HTTP >= 400.
call() {
  local args=(-sS -X "$1" "$2" -H "Authorization: Bearer $3" -w '\n%{http_code}')
  [ $# -ge 4 ] && args+=(-H "Content-Type: application/json" -d "$4")
  [ "$1" = POST ] && [[ "$2" == */detached/claim ]] && args+=(-H "X-Mono-Agent-Service-Name: $SERVICE")
  local out code
  out="$(curl "${args[@]}")"
  code="${out##*$'\n'}"
  out="${out%$'\n'*}"
  if [ "$code" -ge 400 ]; then
    echo "walkthrough: $1 $2 answered HTTP $code: $out" >&2
    exit 1
  fi
  printf '%s\n' "$out"
}

# 1. Claim. The deadline must be in the future and at most 30 days away: take now + 1 day.
DEADLINE="$(python3 -c 'import datetime as d; print((d.datetime.now(d.timezone.utc) + d.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z"))')"
TASK_KEY="report-$(date -u +%Y%m%dT%H%M%S)-$$"   # stable per task: repeating a claim is safe
TASK_HASH="$(printf '%s' "$TASK_KEY" | python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
echo "\$ POST $BASE/v1/continuations/detached/claim  (route $ROUTE, deadline $DEADLINE)"
CLAIM="$(call POST "$BASE/v1/continuations/detached/claim" "$TOKEN" \
  "{\"route\":\"$ROUTE\",\"taskKey\":\"$TASK_KEY\",\"taskHash\":\"$TASK_HASH\",\"deadline\":\"$DEADLINE\"}")"
echo "$CLAIM"
RESULT_URL="$(field resultUrl <<<"$CLAIM")"
STATUS_URL="$(field statusUrl <<<"$CLAIM")"
RESULT_TOKEN="$(field resultToken <<<"$CLAIM")"

# 2. Submit the result. payloadHash is the sha256 of the payload's RFC 8785 canonical JSON
#    (JSON Canonicalization Scheme), the full 64 hex digits; `afterword payload-hash` prints it.
PAYLOAD='{"summary":"3 invoices need approval","actionable":true,"share":1e-7}'
PAYLOAD_HASH="$(printf '%s' "$PAYLOAD" | afterword payload-hash)"
echo "\$ PUT $RESULT_URL  (payloadHash $PAYLOAD_HASH)"
call PUT "$RESULT_URL" "$RESULT_TOKEN" \
  "{\"idempotencyKey\":\"$TASK_KEY/1\",\"payloadHash\":\"$PAYLOAD_HASH\",\"payload\":$PAYLOAD}"

# 3. Follow the status until it settles (delivery takes a moment; a template answer ~1 s).
echo "\$ GET $STATUS_URL"
for _ in $(seq 1 300); do
  STATUS="$(call GET "$STATUS_URL" "$RESULT_TOKEN")"
  STATE="$(field state <<<"$STATUS")"
  case "$STATE" in
    delivered|dead_lettered|delivery_unknown|expired|cancelled) break ;;
  esac
  sleep 0.1
done
echo "$STATUS"
CID="$(field continuationId <<<"$CLAIM")"
echo "walkthrough: $CID is $STATE (inspect it with: afterword continuations show $CID)"
[ "$STATE" = delivered ]
