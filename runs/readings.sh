# Free-running readings of a run's adapter, sourced by runs/*/run.sh; each is skipped when
# its result is already there, so a stopped run resumes.
#   cpu FILE COMMAND...                      -> appends "user system wall" seconds to FILE
#   validate DIR [eval-validation options]   -> DIR/eval-validation.json(l)
#   validate_as NAME DIR [options]           -> DIR/NAME.json(l)
#   chat_fact DIR                            -> DIR/eval/chat-fact.txt
memctl=${MEMCTL:-target/debug/memctl}

cpu() { /usr/bin/time -f "%U %S %e" -a -o "$1" "${@:2}"; }

validate_as() {
  local name="$1" dir="$2"
  shift 2
  if [ ! -s "$dir/$name.json" ]; then
    scripts/eval-validation --memctl "$memctl" --adapter "$dir/adapter.safetensors" --json "$@" \
      > "$dir/$name.jsonl"
    tail -1 "$dir/$name.jsonl" > "$dir/$name.json"
  fi
}

validate() {
  local dir="$1"
  shift
  validate_as eval-validation "$dir" "$@"
}

chat_fact() {
  local dir="$1"
  mkdir -p "$dir/eval"
  if [ ! -s "$dir/eval/chat-fact.txt" ]; then
    MEMAGENT_ADAPTER="$PWD/$dir/adapter.safetensors" MEMAGENT_CHAT_SEEDS=1,2,3,4,5,6,7,8 \
      cargo test -q -p memagent-cli --test daemon a_chat_log -- --nocapture > "$dir/eval/chat-fact.tmp" 2>&1
    mv "$dir/eval/chat-fact.tmp" "$dir/eval/chat-fact.txt"
  fi
}
