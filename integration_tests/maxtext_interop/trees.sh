#!/bin/bash
PY=/tmp/mtvenv/bin/python
S=/work/main/integration_tests/maxtext_interop/maxtext_logits.py
BASE='"base_emb_dim":256,"base_num_query_heads":4,"base_num_kv_heads":2,"head_dim":64,"base_mlp_dim":512,"vocab_size":512'
declare -A EXTRA
EXTRA[qwen3-8b]='"base_num_decoder_layers":4'
EXTRA[qwen3-30b-a3b]='"base_num_decoder_layers":4,"num_experts":4,"num_experts_per_tok":2,"base_moe_mlp_dim":128'
EXTRA[llama2-7b]='"base_num_decoder_layers":4'
EXTRA[llama3-8b]='"base_num_decoder_layers":4'
EXTRA[llama3.1-8b]='"base_num_decoder_layers":4'
EXTRA[mistral-7b]='"base_num_decoder_layers":4'
EXTRA[mixtral-8x7b]='"base_num_decoder_layers":4,"num_experts":4,"num_experts_per_tok":2,"base_moe_mlp_dim":512'
EXTRA[qwen2.5-7b]='"base_num_decoder_layers":4'
EXTRA[gemma-2b]='"base_num_decoder_layers":4'
EXTRA[gemma2-2b]='"base_num_decoder_layers":4'
EXTRA[gemma3-4b]='"base_num_decoder_layers":8'
for m in qwen3-8b qwen3-30b-a3b llama2-7b llama3-8b llama3.1-8b mistral-7b mixtral-8x7b qwen2.5-7b gemma-2b gemma2-2b gemma3-4b; do
 for s in true false; do
  echo "=== $m scan_layers=$s"
  $PY $S --print_param_tree --model_name=$m --overrides="{$BASE,${EXTRA[$m]},\"scan_layers\":$s}" 2>trees/$m.$s.err || echo "FAILED rc=$? (see stderr)"
 done
done
