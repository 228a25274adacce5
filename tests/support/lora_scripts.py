"""microsoft/LoRA's GLUE recipes for MNLI, as their shell scripts run them (examples/NLU)."""

ROBERTA_BASE_MNLI = """\
export num_gpus=8
export CUBLAS_WORKSPACE_CONFIG=":16:8"
export PYTHONHASHSEED=0
python -m torch.distributed.launch --nproc_per_node=$num_gpus \\
    examples/text-classification/run_glue.py \\
    --model_name_or_path roberta-base \\
    --task_name mnli --do_train --do_eval \\
    --max_seq_length 512 --per_device_train_batch_size 16 \\
    --learning_rate 5e-4 --num_train_epochs 30 \\
    --output_dir $output_dir/model --overwrite_output_dir \\
    --logging_steps 10 --evaluation_strategy epoch \\
    --save_strategy epoch --warmup_ratio 0.06 \\
    --apply_lora --lora_r 8 --lora_alpha 16 \\
    --seed 0 --weight_decay 0.1
"""
DEBERTA_V2_XXLARGE_MNLI = """\
export num_gpus=8
export CUBLAS_WORKSPACE_CONFIG=":16:8"
export PYTHONHASHSEED=0
python -m torch.distributed.launch --nproc_per_node=$num_gpus \\
    examples/text-classification/run_glue.py \\
    --model_name_or_path microsoft/deberta-v2-xxlarge \\
    --task_name mnli --do_train --do_eval --max_seq_length 256 --per_device_train_batch_size 8 \\
    --learning_rate 1e-4 --num_train_epochs 5 --output_dir $output_dir/model --overwrite_output_dir \\
    --logging_steps 10 --fp16 --evaluation_strategy steps --eval_steps 500 --save_strategy steps \\
    --save_steps 500 --warmup_steps 1000 --cls_dropout 0.15 --apply_lora --lora_r 16 --lora_alpha 32 \\
    --seed 0 --weight_decay 0 --use_deterministic_algorithms
"""
