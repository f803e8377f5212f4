# tests/serve/server.sh — sourced by the serve test scripts: serve_start NAME [kl serve flags]
# synthesizes a tiny checkpoint in a temporary folder and starts `$kl serve` on it at a free
# port of 127.0.0.1 (sets $tmp, $pid, $port; the folder and a running server go at exit);
# serve_stop NAME sends SIGTERM and fails unless the server exits 0.
serve_start() {
    name=$1
    shift
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/kl-serve-XXXXXX")
    pid=""
    trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
    "$kl" synth "$tmp/tiny" --preset tiny --seed 3 -q > /dev/null
    mkfifo "$tmp/out"
    "$kl" serve "$tmp/tiny" --port 0 --json --threads 2 --served-model-name tiny -q "$@" \
        > "$tmp/out" &
    pid=$!
    read -r line < "$tmp/out"
    port=$(printf '%s' "$line" | sed -n 's/.*"port":\([0-9]*\).*/\1/p')
    [ -n "$port" ] || { echo "$name: no port in: $line" >&2; exit 1; }
}

serve_stop() {
    kill -TERM "$pid"
    st=0
    wait "$pid" || st=$?
    pid=""
    [ "$st" -eq 0 ] || { echo "$1: kl serve ended with status $st" >&2; exit 1; }
}
