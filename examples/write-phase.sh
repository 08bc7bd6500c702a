#!/usr/bin/env bash
# A batch skill's write phase under skill-lock, step by step as in
# docs/write-lock.md: status before reading, acquire --since, read again
# unless status said free and others_since is false (true, or null without
# --since: read again), compose each of three simulated posts, renew, then
# send it at once; recap, release with the token; and release in the
# stop-and-surface path (a trap) when anything fails after the acquire. The
# token travels in SKILL_LOCK_TOKEN set for each command alone (a renew
# without it is refused, exit 2), never in a variable that must outlive one
# shell. The ttl (900 s) exceeds the longest gap between two renewals, the
# whole post included; never leave --ttl out (7200 s: a killed run would
# block the next for 2 hours).
#
#   examples/write-phase.sh [POSTS_FILE]
#
# Run it inside a checkout: the lock's project root is found from the current
# directory. A "post" appends one line to POSTS_FILE (default: a temp file).
#   SKILL_LOCK  the skill-lock binary (default: skill-lock on PATH), or a whole
#               launcher, e.g. 'uvx --from ~/.claude/magpie/skill-lock skill-lock'
#   SKILL       the skill name (default: example-sweep)
#   REPO        the repository posted to (default: apache/example)
# Exit status: 0 when the posts were made or another run holds the lock
# (already_running is not a failure), 4 when the lease was lost, 2 on errors.
set -euo pipefail
# When SKILL_LOCK is a uvx launcher that must build: fail fast without cargo (docs/install.md).
export MATURIN_NO_INSTALL_RUST=${MATURIN_NO_INSTALL_RUST:-1}

if [ -x "${SKILL_LOCK:-}" ]; then
    sl=("$SKILL_LOCK") # a path, even one with spaces
else
    read -r -a sl <<<"${SKILL_LOCK:-skill-lock}"
fi
skill=${SKILL:-example-sweep}
repo=${REPO:-apache/example}
posts=${1:-$(mktemp "${TMPDIR:-/tmp}/write-phase-posts.XXXXXX")}

# get JSON PATH: one field of a result (PATH like holder.note); '' when absent or null.
get() {
    python3 -c 'import json, sys
v = json.loads(sys.argv[1])
for k in sys.argv[2].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else (v if isinstance(v, str) else json.dumps(v)))' "$1" "$2"
}

# lock SUBCOMMAND ARGS...: run skill-lock; sets OUT (its JSON) and RC (its exit status).
lock() {
    RC=0
    OUT=$("${sl[@]}" "$1" "$skill" --repo "$repo" "${@:2}") || RC=$?
    # No JSON object at all (e.g. the launcher could not build the tool): an error.
    case "$OUT" in
        "{"*) ;;
        *)
            OUT='{"result":"error","error":"launcher","message":"skill-lock printed no JSON"}'
            if [ "$RC" = 0 ]; then RC=2; fi
            ;;
    esac
}

token=""
# Stop-and-surface path: whatever ends the script after the acquire, release
# with the token first. With the token it never removes another run's lock.
release_on_exit() {
    local status=$?
    if [ -n "$token" ]; then
        SKILL_LOCK_TOKEN=$token lock release
        echo "stop-and-surface: released with the token: $(get "$OUT" result) (exit $RC)"
    fi
    exit "$status"
}
trap release_on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 1. Before reading, note the lock's state (free, held or stale) and fence.
lock status
if [ "$RC" != 0 ]; then
    echo "status failed (exit $RC): $(get "$OUT" message)" >&2
    exit 2
fi
state=$(get "$OUT" state)
since=$(get "$OUT" fence)
since=${since:-0}
echo "read and classify (lock $state, fence $since): 3 posts to make"

# 2. Acquire before the first write, with that fence.
lock acquire --since "$since" --ttl 900 --note "write-phase.sh pid $$"
case "$RC" in
    0)
        token=$(get "$OUT" token)
        fence=$(get "$OUT" fence)
        echo "acquired $skill on $repo: fence $fence, lease until $(get "$OUT" expires)"
        if [ -n "$(get "$OUT" took_over)" ]; then
            echo "took over a stale lock ($(get "$OUT" took_over.reason)) started $(get "$OUT" took_over.holder.started)"
        fi
        # Read again unless status said free and others_since is false.
        if [ "$state" != free ] || [ "$(get "$OUT" others_since)" != false ]; then
            echo "the lock was $state at the read, others_since $(get "$OUT" others_since): reading again before posting"
        fi
        ;;
    3)
        echo "already_running: another run holds $skill on $repo; not posting."
        echo "  holder: note=$(get "$OUT" holder.note) host=$(get "$OUT" holder.host)" \
            "started=$(get "$OUT" holder.started) expires=$(get "$OUT" holder.expires) (in $(get "$OUT" expires_in) s)"
        echo "  if that run is known to be dead, an operator runs: $(get "$OUT" hint)"
        exit 0
        ;;
    *)
        echo "acquire failed (exit $RC): $(get "$OUT" error): $(get "$OUT" message)" >&2
        exit 2
        ;;
esac

# 3. Compose each post, renew immediately before sending it (it also says at
# once when the lease was lost), then send it at once.
for n in 1 2 3; do
    post="post $n to $repo by $skill (fence $fence)"
    SKILL_LOCK_TOKEN=$token lock renew
    case "$RC" in
        0) ;;
        4)
            echo "lease lost before post $n ($(get "$OUT" result)): stopping posts now" >&2
            exit 4
            ;;
        *)
            echo "renew failed (exit $RC): $(get "$OUT" message)" >&2
            exit 2
            ;;
    esac
    echo "$post" >>"$posts"
    echo "renewed, posted $n (lease until $(get "$OUT" expires))"
done

# 4. Recap, then release with the token.
echo "recap: 3 posts to $repo, in $posts"
SKILL_LOCK_TOKEN=$token lock release
token="" # released (or refused): the exit trap has nothing left to do
case "$RC" in
    0) echo "released ($(get "$OUT" result))" ;;
    4) echo "release refused: the lock is now held by $(get "$OUT" holder.note) on $(get "$OUT" holder.host)" >&2 ;;
    *) echo "release failed (exit $RC): $(get "$OUT" message); the lease ends by itself" >&2 ;;
esac
