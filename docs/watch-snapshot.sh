#!/usr/bin/env bash
# The screen snapshot in docs/watch.md and the README: `crosstalk watch` in a real terminal
# (tmux, 160x45) beside three real agents talking (bench/watch_chatter.py), captured with
# `tmux capture-pane`. Run from a checkout with .venv installed:  bash docs/watch-snapshot.sh
set -euo pipefail
cd "$(dirname "$0")/.."
home=$(mktemp -d /tmp/ct-watch-XXXXXX)
sock=ct-watch-$$
trap 'tmux -L "$sock" kill-server 2>/dev/null || true; rm -rf "$home"' EXIT
export CROSSTALK_HOME=$home
.venv/bin/python bench/watch_chatter.py --every 2 >"$home.chatter.log" 2>&1 &
chatter=$!
trap 'kill "$chatter" 2>/dev/null || true; tmux -L "$sock" kill-server 2>/dev/null || true; rm -rf "$home" "$home.chatter.log"' EXIT
sleep "${WARMUP:-9}"
tmux -L "$sock" new-session -d -x 160 -y 45 \
  "env CROSSTALK_HOME=$home TERM=xterm-256color .venv/bin/crosstalk watch"
sleep "${SETTLE:-4}"
tmux -L "$sock" capture-pane -p -t 0 | sed -e 's/[[:space:]]*$//'
