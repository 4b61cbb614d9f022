#!/usr/bin/env bash
# A client command for the conformance suite's client scenarios:
#
#   conformance client --command "tests/peers/conformance/through-proxy.sh" --suite auth -o DIR
#   conformance client --command "tests/peers/conformance/through-proxy.sh --direct" --suite auth -o DIR
#
# The suite appends the URL of the server it plays (`http://localhost:PORT/mcp`) as the last
# argument and sets MCP_CONFORMANCE_SCENARIO (and MCP_CONFORMANCE_CONTEXT). This script starts
# `toolwall mcp-proxy --upstream URL` on a free loopback port and runs the suite's reference client
# (everything-client.ts, here) against the proxy's URL with the same path and query (/mcp for an
# upstream at its root); with
# `--direct` it runs that client against URL itself, for the baseline. It exits with the client's
# status (2 if the proxy or the client could not start).
#
# Environment:
#   TOOLWALL_BIN         the toolwall binary (default: target/debug/toolwall)
#   TOOLWALL_PEERS_DIR   where `cargo xtask peers` installed the peers (default: target/peers);
#                        the client's modules (SDK, zod 3, tsx) are its conformance/node_modules
#   TOOLWALL_PROXY_ARGS  more mcp-proxy arguments, split on whitespace
#   TOOLWALL_PROXY_WAIT  seconds to wait for the proxy's port (default: 30)
#   TMPDIR               the proxy's log is kept there, in toolwall-through-proxy.*/proxy.log;
#                        its path is printed on stderr (the suite saves that in stderr.txt)
#
# `node` is taken from PATH.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
root=$(cd "$here/../../.." && pwd -P)
peers=${TOOLWALL_PEERS_DIR:-$root/target/peers}
modules=$peers/conformance/node_modules
bin=${TOOLWALL_BIN:-$root/target/debug/toolwall}

direct=0
if [ "${1:-}" = "--direct" ]; then
    direct=1
    shift
fi
if [ $# -lt 1 ]; then
    echo "usage: $0 [--direct] URL   (the conformance suite appends URL)" >&2
    exit 2
fi
upstream=${!#}

if [ ! -e "$modules/tsx" ]; then
    echo "$modules/tsx does not exist: run \`cargo xtask peers\`" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/toolwall-through-proxy.XXXXXX") || exit 2
work=$(cd "$work" && pwd -P)
proxy_pid=
client_pid=

cleanup() {
    if [ -n "$client_pid" ]; then
        kill "$client_pid" 2>/dev/null
        wait "$client_pid" 2>/dev/null
    fi
    if [ -n "$proxy_pid" ]; then
        kill "$proxy_pid" 2>/dev/null
        wait "$proxy_pid" 2>/dev/null
    fi
    if [ "$direct" = 1 ]; then
        rm -rf "$work"
    else
        rm -rf "$work/client"
    fi
}
# The suite ends a client that runs past its timeout with SIGTERM: take the proxy along.
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 130' INT
trap cleanup EXIT

# Node resolves the client's imports from where its files really are, so they run from a copy
# beside a link to the installed modules (as the suite's repository lays them out: an ES module
# package). The copy's path is canonical: the client only runs its main() when argv[1] equals
# the path of its own module URL, which Node resolves through symlinks.
mkdir -p "$work/client" &&
    cp -R "$here/everything-client.ts" "$here/helpers" "$here/schemas" "$work/client/" &&
    printf '{"type": "module"}\n' >"$work/client/package.json" &&
    ln -s "$modules" "$work/client/node_modules" || exit 2

target=$upstream
if [ "$direct" = 0 ]; then
    port=$(node -e '
        const s = require("net").createServer();
        s.listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });
    ') || exit 2
    # The path (and query) of the upstream URL; the proxy serves no MCP endpoint at the root, so
    # an upstream at its root (the suite's non-auth scenarios) is reached at /mcp.
    rest=${upstream#*://}
    case "$rest" in
        */?*) path=/${rest#*/} ;;
        *) path=/mcp ;;
    esac
    log=$work/proxy.log
    echo "through-proxy: toolwall mcp-proxy --upstream $upstream --listen 127.0.0.1:$port; log: $log" >&2
    # shellcheck disable=SC2086 # TOOLWALL_PROXY_ARGS is a list of words
    NO_COLOR=1 "$bin" mcp-proxy --upstream "$upstream" --listen "127.0.0.1:$port" \
        --deny '^never_' ${TOOLWALL_PROXY_ARGS:-} </dev/null >"$log" 2>&1 &
    proxy_pid=$!
    deadline=$((SECONDS + ${TOOLWALL_PROXY_WAIT:-30}))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        if ! kill -0 "$proxy_pid" 2>/dev/null; then
            wait "$proxy_pid"
            echo "through-proxy: toolwall mcp-proxy exited with status $? before listening:" >&2
            cat "$log" >&2
            proxy_pid=
            exit 2
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "through-proxy: toolwall mcp-proxy did not listen on 127.0.0.1:$port within ${TOOLWALL_PROXY_WAIT:-30} s:" >&2
            cat "$log" >&2
            exit 2
        fi
        sleep 0.1
    done
    target=http://127.0.0.1:$port$path
fi

# In the background, so that the TERM trap runs while the client does.
(cd "$work/client" && exec node --import tsx everything-client.ts "$target") &
client_pid=$!
wait "$client_pid"
status=$?
client_pid=
if [ "$direct" = 0 ] && ! kill -0 "$proxy_pid" 2>/dev/null; then
    echo "through-proxy: toolwall mcp-proxy ended before the client did; its log:" >&2
    cat "$log" >&2
fi
exit "$status"
