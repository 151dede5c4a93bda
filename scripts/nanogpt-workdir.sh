#!/usr/bin/env bash
# Sourced by the scripts that run nanoGPT beside tinygpt: nanogpt_workdir NANOGPT_DIR PYTHON
# INPUT_TXT WORK fills WORK with what nanoGPT's train.py reads from its working directory
# (train.py, model.py, configurator.py, config/) and INPUT_TXT prepared by its char prepare.py
# as data/shakespeare_char (nanoGPT's char prepare.py reads any text).
nanogpt_workdir() {
  local nanogpt=$1 python=$2 input=$3 work=$4
  mkdir -p "$work/data/shakespeare_char"
  cp "$input" "$work/data/shakespeare_char/input.txt"
  cp "$nanogpt/data/shakespeare_char/prepare.py" "$work/data/shakespeare_char/"
  cp "$nanogpt"/{train.py,model.py,configurator.py} "$work/"
  cp -r "$nanogpt/config" "$work/"
  (cd "$work" && "$python" data/shakespeare_char/prepare.py >/dev/null)
}
