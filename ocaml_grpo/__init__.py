"""Everything the commands import, in rooms. A room imports only from itself and the rooms below
it (tests/test_layout.py checks it), so each can be read without the ones above:

    commands/   the commands' bodies: a GRPO run's phases (preflight.py: config, data and memory
                before any model loads; grpo_run.py: model, trainer, run), SFT, the demo, the
                memory estimate, evaluation and its probe, the reward CLI's re-scoring, the
                offline bundle's build
    report/     the training-health report analyze.py prints (run_report.py), its plots, the
                groups' and repair turns' reports
    training/   the trainer and what it runs on: callbacks, health rules, learning log, problem
                tracking and selection, run directory, generation engines (llama.cpp's too), the
                shared-prefix forward, repair turns, sampling and pass@k
    models/     loading, LoRA and merging; the named pretrained models (GGUF from registry
                wheels); the tiny local models the tests and the demo build
    scoring/    the reward engine: the scorer (a completion graded and paid by the reward's parts, its
                rules) and the TRL reward function with its JSONL logs; rewards.py is its door
    grading/    one completion against its tests: the grader, both compile paths and their
                diagnostics, the oracle and the trusted test program, the sandbox and its launcher,
                the grader's OCaml tools (grading/ocaml/), the audit of a problem set
    config/     every setting, defined once and typed; resolving them loads no grader
    reward/     the reward's parts, weights and curriculum, the record of one scored completion, and
                a GRPO group's kind (group_kinds.py)
    (root)      what every room reads: problems, prompts, JSONL files

The root scripts are the doors: train.py, analyze.py, evaluate.py, and rewards.py (the reward
policy and the door to the reward engine a TRL user imports), each its arguments and named phases
over commands/. ocaml_sandbox.py is the sandbox's public door. Nothing in this package imports a
root script.
Settings are resolved by the commands (config.resolve) and passed down as typed configs
(TrainConfig, RewardConfig, SandboxConfig).
"""
