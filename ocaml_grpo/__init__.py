"""Everything the commands import, in rooms. A room imports only from itself and the rooms below
it (tests/test_layout.py checks it), so each can be read without the ones above:

    report/     what analyze.py renders: the plots, the groups' report
    training/   the trainer's parts: callbacks, health rules, learning log, problem tracking and
                selection, run directory, generation engines (llama.cpp's too), the
                shared-prefix forward, SFT, the demo, sampling and pass@k, the probe, memory
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

The commands sit on top: train.py, analyze.py, evaluate.py, and rewards.py (the reward policy and
the door to the reward engine a TRL user imports). ocaml_sandbox.py is the sandbox's public door. Nothing in
this package imports a command.
Settings are resolved by the commands (config.resolve) and passed down as typed configs
(TrainConfig, RewardConfig, SandboxConfig).
"""
