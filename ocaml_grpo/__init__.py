"""Everything the commands import. The layers, checked by tests/test_layout.py:

    train.py, analyze.py, evaluate.py     the commands a user runs (and `train.py sft|demo|merge`)
    rewards.py                            the reward policy: scores completions, writes its logs
    ocaml_grpo/grading/grader.py, compilers.py    compile, check and run one solution against its tests
    ocaml_sandbox.py                      every toolchain call and every run of model code, isolated

Nothing in this package imports rewards.py or a command: what they share lives here (the
reward's settings in reward_config.py, sampling and pass@k in evaluation.py), and what only a
command may build (the reward's scorer) is passed in by that command. Settings are resolved by
the commands and passed down as typed configs (RewardConfig, SandboxConfig)."""
