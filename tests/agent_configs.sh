#!/usr/bin/env bash
# Check the `agent` sections that `smithfs init --agent X` writes (agents/configs/*.json, and with
# `--no-sandbox` agents/configs/prompting/*.json where a CLI has a prompting mode of its own):
#   1. valid JSON; only the keys of docs/SPEC.md §8 `agent` with the right types;
#   2. every `{...}` in the command is one of {mount} {smith_dir} {task_file} {smith_id} {full_id} {level};
#   3. the command runs as smithfs would run it (placeholders filled, cwd = smith dir, §5 environment,
#      CLAUDECODE=1 inherited as when smithfs is started from a Claude Code session) against stand-ins
#      for the agent CLIs: each stand-in accepts only the flags its CLI documents, checks the ones the
#      headless mode needs, records its argv, and plays an obedient model (publishes outbox/result.md);
#      the reference config runs the real reference agent.
# The real CLIs are not installed here; where one is on PATH, `--help` is checked for the flags too.
# Needs python3 (for JSON). Exit 0 if every check passes.
set -euo pipefail
export LC_ALL=C
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d -t smith-agent-configs.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
pass=0 fail=0
ok() {
    pass=$((pass + 1))
    echo "  ok   $*"
}
bad() {
    fail=$((fail + 1))
    echo "  FAIL $*"
}
command -v python3 >/dev/null || {
    echo "agent_configs: python3 is needed"
    exit 1
}

# --- stand-ins --------------------------------------------------------------------------------
FAKE=$WORK/bin
mkdir -p "$FAKE"
# fake NAME 'FLAGS WITH A VALUE' 'BOOLEAN FLAGS' CHECKS: a stand-in that rejects undocumented flags
fake() {
    cat >"$FAKE/$1" <<EOF
#!/usr/bin/env bash
# stand-in for $1: documented flags only
set -u
printf '%s\n' "\$@" >"\$FAKE_LOG/$1.argv"
valued=" $2 "
boolean=" $3 "
declare -A opt
pos=()
sub=""
while [ \$# -gt 0 ]; do
    a=\$1; shift
    case \$a in
    --*=*) k=\${a%%=*}; v=\${a#*=}
        case \$valued in *" \$k "*) opt[\$k]=\$v ;; *) echo "$1: unknown option \$k" >&2; exit 2 ;; esac ;;
    -*) if [[ \$valued == *" \$a "* ]]; then [ \$# -gt 0 ] || { echo "$1: \$a needs a value" >&2; exit 2; }
            opt[\$a]=\${opt[\$a]:+\${opt[\$a]},}\$1; shift
        elif [[ \$boolean == *" \$a "* ]]; then opt[\$a]=1
        else echo "$1: unknown option \$a" >&2; exit 2; fi ;;
    *) pos+=("\$a") ;;
    esac
done
$4
EOF
    chmod +x "$FAKE/$1"
}
# what an obedient model does at the end: publish a result the way the prompt says
PUBLISH='printf "# result of %s\n" "$SMITH_FULL_ID" >private/result.md && mv private/result.md outbox/result.md'
PROMPT_CHECK='case $prompt in *private/START_HERE.md*) ;; *) echo "prompt does not point at private/START_HERE.md" >&2; exit 3 ;; esac
case $prompt in *"$SMITH_TASK_FILE"*) ;; *) echo "prompt does not name the task file" >&2; exit 3 ;; esac
case $prompt in *"{"*) echo "unfilled placeholder in the prompt" >&2; exit 3 ;; esac'

# Claude Code: `claude -p [prompt]` (print mode); permission mode; tool rules; refuses nested sessions
fake claude '--permission-mode --allowedTools --allowed-tools --disallowedTools --add-dir --output-format --model --append-system-prompt --max-turns --mcp-config --settings' \
    '-p --print --dangerously-skip-permissions --verbose --continue -c' '
[ -z "${CLAUDECODE+x}" ] || { echo "Error: Claude Code cannot be launched inside another Claude Code session." >&2; exit 1; }
[ -n "${opt[-p]:-}${opt[--print]:-}" ] || { echo "claude: not in print mode (-p)" >&2; exit 3; }
case ${opt[--permission-mode]:-default} in acceptEdits | bypassPermissions | default | plan | dontAsk) ;; *) echo "bad --permission-mode" >&2; exit 2 ;; esac
[ -n "${opt[--dangerously-skip-permissions]:-}" ] || [ "${opt[--permission-mode]:-}" = bypassPermissions ] ||
    case ${opt[--allowedTools]:-} in *"Bash(mkdir:*)"*"Bash(mv:*)"*) ;; *) echo "mkdir/mv not allowed: the smith cannot dispatch or publish" >&2; exit 3 ;; esac
[ ${#pos[@]} -eq 1 ] || { echo "claude: expected one prompt, got ${#pos[@]}" >&2; exit 3; }
prompt=${pos[0]}
'"$PROMPT_CHECK"'
'"$PUBLISH"

# Codex: `codex exec [OPTIONS] [PROMPT]`
fake codex '--sandbox -s --cd -C --model -m --color --output-last-message -o --profile -p --config -c --ask-for-approval -a --add-dir' \
    '--full-auto --skip-git-repo-check --json --ephemeral --dangerously-bypass-approvals-and-sandbox --yolo' '
[ "${pos[0]:-}" = exec ] || { echo "codex: not exec" >&2; exit 3; }
if [ -n "${opt[--dangerously-bypass-approvals-and-sandbox]:-}${opt[--yolo]:-}" ]; then
    [ -z "${opt[--sandbox]:-${opt[-s]:-}}${opt[--full-auto]:-}" ] || { echo "codex: a sandbox mode with the bypass" >&2; exit 2; }
else
    case ${opt[--sandbox]:-${opt[-s]:-}}${opt[--full-auto]:+full-auto} in workspace-write | full-auto | workspace-writefull-auto) ;; *) echo "codex: no write access (sandbox ${opt[--sandbox]:-read-only})" >&2; exit 3 ;; esac
fi
[ -n "${opt[--skip-git-repo-check]:-}" ] || { echo "Not inside a trusted directory and --skip-git-repo-check was not specified." >&2; exit 1; }
case ${opt[--color]:-auto} in always | never | auto) ;; *) exit 2 ;; esac
[ "${opt[--cd]:-$PWD}" = "$PWD" ] || { echo "codex: --cd is not the smith dir" >&2; exit 3; }
[ ${#pos[@]} -eq 2 ] || { echo "codex: expected one prompt" >&2; exit 3; }
prompt=${pos[1]}
'"$PROMPT_CHECK"'
'"$PUBLISH"

# Gemini CLI: `gemini -p PROMPT` (headless), approval mode yolo (or the older --yolo, not both)
fake gemini '--prompt -p --model -m --approval-mode --include-directories --output-format -o --allowed-tools' \
    '--yolo -y --sandbox -s --debug -d --skip-trust' '
p=${opt[-p]:-${opt[--prompt]:-}}
[ -n "$p" ] || { echo "gemini: no -p, would start interactive" >&2; exit 3; }
if [ -n "${opt[--yolo]:-}${opt[-y]:-}" ] && [ -n "${opt[--approval-mode]:-}" ]; then echo "gemini: --yolo and --approval-mode together" >&2; exit 42; fi
case ${opt[--approval-mode]:-}${opt[--yolo]:+yolo}${opt[-y]:+yolo} in
yolo) ;;
auto_edit) case ${opt[--allowed-tools]:-} in *"run_shell_command(mkdir)"*"run_shell_command(mv)"*) ;; *) echo "gemini: mkdir/mv would wait for approval" >&2; exit 3 ;; esac ;;
*) echo "gemini: tools would wait for approval" >&2; exit 3 ;; esac
prompt=$p
'"$PROMPT_CHECK"'
'"$PUBLISH"

# aider: one message, then exit; --yes-always answers confirmations (not shell commands): it
# writes outbox/result.md with an edit, no mv
fake aider '--message --msg -m --message-file -f --read --file --model --edit-format --map-tokens --input-history-file --chat-history-file --env-file' \
    '--yes-always --no-git --git --no-auto-commits --no-check-update --no-show-release-notes --no-pretty --no-stream --no-gitignore --no-suggest-shell-commands' '
m=${opt[--message]:-${opt[--msg]:-${opt[-m]:-}}}
if [ -n "${opt[--message-file]:-}${opt[-f]:-}" ]; then m=$(cat "${opt[--message-file]:-${opt[-f]}}"); fi
[ -n "$m" ] || { echo "aider: no message, would start the chat" >&2; exit 3; }
[ -n "${opt[--yes-always]:-}" ] || { echo "aider: would ask for confirmation" >&2; exit 3; }
[ -n "${opt[--no-git]:-}" ] || { echo "aider: would offer to create a git repo" >&2; exit 3; }
IFS=, read -ra reads <<<"${opt[--read]:-}"
for r in "${reads[@]}"; do [ -r "$r" ] || { echo "aider: --read $r: no such file" >&2; exit 3; }; done
case ",${opt[--read]:-}," in *,private/START_HERE.md,*) ;; *) echo "aider: START_HERE.md not read" >&2; exit 3 ;; esac
case ",${opt[--read]:-}," in *",$SMITH_TASK_FILE,"*) ;; *) echo "aider: the task is not read" >&2; exit 3 ;; esac
case $m in *outbox/result.md*) ;; *) echo "aider: the message does not say where the result goes" >&2; exit 3 ;; esac
printf "# result of %s\n" "$SMITH_FULL_ID" >outbox/result.md'

# --- checks ---------------------------------------------------------------------------------------
# agents/configs/NAME.json: the unattended modes (with the sandbox); agents/configs/prompting/: the
# prompting modes `init --no-sandbox` writes (docs/SPEC.md §12)
for f in "$HERE"/agents/configs/*.json "$HERE"/agents/configs/prompting/*.json; do
    name=$(basename "$f" .json)
    case $f in */prompting/*) name=prompting-$name ;; esac
    echo "== $name"
    if out=$(python3 - "$f" <<'EOF'
import json, re, sys
ALLOWED_KEYS = {"command": list, "env": dict, "timeout_secs": int, "retries": int, "kill_grace_secs": int}
PLACEHOLDERS = {"mount", "smith_dir", "task_file", "smith_id", "full_id", "level"}
a = json.load(open(sys.argv[1]))
errs = []
if not isinstance(a, dict): errs.append("not an object")
for k, v in a.items():
    if k not in ALLOWED_KEYS: errs.append(f"unknown key agent.{k}")
    elif not isinstance(v, ALLOWED_KEYS[k]) or isinstance(v, bool): errs.append(f"agent.{k} has the wrong type")
cmd = a.get("command")
if not cmd or not all(isinstance(x, str) for x in cmd): errs.append("agent.command is not a non-empty list of strings")
for k, v in a.get("env", {}).items():
    if not isinstance(v, str): errs.append(f"agent.env.{k} is not a string")
for x in cmd or []:
    for m in re.findall(r"\{[^{}]*\}", x):
        if m[1:-1] not in PLACEHOLDERS: errs.append(f"unknown placeholder {m}")
    if x.count("{") != x.count("}"): errs.append("unbalanced braces in " + x[:40])
for k in ("timeout_secs", "kill_grace_secs"):
    if k in a and a[k] <= 0: errs.append(f"agent.{k} must be positive")
print("\n".join(errs))
sys.exit(1 if errs else 0)
EOF
    ); then ok "valid JSON, keys, types, placeholders"; else bad "$out"; fi

    # a fake mount with one smith and a small data set
    m=$WORK/mnt-$name
    mkdir -p "$m/smiths/smith-root"/{inbox,private,outbox,children,conversations} "$m/agents" "$m/.smithfs" "$m/log"
    cp "$HERE/agents/reference.sh" "$m/agents/"
    printf '# Smith smith-root\n' >"$m/smiths/smith-root/smith.md"
    printf '# Start here\n' >"$m/smiths/smith-root/private/START_HERE.md"
    mkdir -p "$m/smiths/smith-root/inbox/data/a" && printf 'x\ny\n' >"$m/smiths/smith-root/inbox/data/a/f.rs"
    printf '# Task: census\n\ncensus-data: inbox/data\n' >"$m/smiths/smith-root/inbox/task-root.md"
    if [ "$name" = coder ]; then
        # the coding agent works in a workspace (docs/SPEC.md §11): a git work tree with one file
        cp "$HERE/agents/coder.sh" "$m/agents/"
        ws=$m/smiths/smith-root/workspace
        mkdir -p "$ws" && printf 'fn main() {}\n' >"$ws/main.rs"
        git -C "$ws" init -q -b smith/smith-root && git -C "$ws" add -A &&
            git -C "$ws" -c user.name=smith-root -c user.email=r@smithfs.invalid commit -qm base
        git -C "$ws" config user.name smith-root && git -C "$ws" config user.email r@smithfs.invalid
        printf '# Task: headers\n\ncoder-header: SPDX-License-Identifier: MIT\n' >"$m/smiths/smith-root/inbox/task-root.md"
    fi
    dir=$m/smiths/smith-root task=$dir/inbox/task-root.md
    mapfile -t argv < <(python3 - "$f" "$m" "$dir" "$task" <<'EOF'
import json, sys
a = json.load(open(sys.argv[1]))
vals = {"mount": sys.argv[2], "smith_dir": sys.argv[3], "task_file": sys.argv[4], "smith_id": "smith-root",
        "full_id": "smith-root", "level": "0"}
for x in a["command"]:
    for k, v in vals.items(): x = x.replace("{" + k + "}", v)
    print(x.replace("\n", " "))
EOF
    )
    real=${argv[0]}
    [ "$real" = env ] && real=$(for ((i = 1; i < ${#argv[@]}; i++)); do case ${argv[i]} in -u) i=$((i + 1)) ;; -*) ;; *) echo "${argv[i]}" && break ;; esac; done)
    if command -v "$real" >/dev/null 2>&1 && [ ! -x "$FAKE/$real" ]; then
        ok "$real is installed: $("$real" --version 2>/dev/null | head -n 1)"
    elif [ -x "$FAKE/$real" ]; then
        echo "  note $real is not installed here: running the stand-in"
    fi
    rc=0
    (cd "$dir" && env PATH="$FAKE:$PATH" FAKE_LOG="$m/log" CLAUDECODE=1 SMITH_ID=smith-root SMITH_FULL_ID=smith-root \
        SMITH_LEVEL=0 SMITH_PARENT= SMITH_DIR="$dir" SMITH_TASK_FILE="$task" SMITH_WAKE=task SMITH_MOUNT="$m" \
        "${argv[@]}" </dev/null >"$m/log/out" 2>&1) || rc=$?
    if [ "$name" = coder ] && [ "$rc" = 0 ] && ! head -n 1 "$dir/workspace/main.rs" | grep -q '^// SPDX'; then
        bad "the coding agent did not edit workspace/main.rs"
    elif [ "$rc" = 0 ] && [ -f "$dir/outbox/result.md" ]; then
        ok "runs as smithfs would run it and publishes outbox/result.md"
    else
        bad "exit $rc, result: $([ -f "$dir/outbox/result.md" ] && echo yes || echo no): $(tail -n 3 "$m/log/out")"
    fi
done
echo
echo "agent_configs: $pass passed, $fail failed"
[ "$fail" = 0 ]
