#!/bin/bash
# A Megatron-LM launch in the style of examples/gpt3/train_gpt3_175b_distributed.sh, with the
# settings of Narayanan et al. 2021 (SC21) for GPT-3 175B on 1024 GPUs (t=8, p=8, d=16, v=2).
GPUS_PER_NODE=8
NUM_NODES=128

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)

GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --attention-backend auto # Can use (flash/fused/unfused/local)
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --train-iters 500000
    --weight-decay 0.1
    --init-method-std 0.006
    --clip-grad 1.0
    --bf16
    --lr 6.0e-5
    --recompute-activations
)

MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size 8
	--pipeline-model-parallel-size 8
	--num-layers-per-virtual-pipeline-stage 6
	--sequence-parallel
	--use-distributed-optimizer
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --vocab-size 51200
    --vocab-file $VOCAB_FILE
    --merge-file $MERGE_FILE
    --split 949,50,1
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]}
