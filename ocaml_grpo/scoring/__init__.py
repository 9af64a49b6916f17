"""The reward engine: the scorer (scorer.py) and the TRL reward function with its logs
(trl_reward.py). rewards.py is its door for TRL users and the `score` / `feedback` / `audit` CLI."""
from ocaml_grpo.scoring.trl_reward import RewardLogger, groups_of, make_reward_function  # noqa: F401
from ocaml_grpo.scoring.scorer import GuardedScorer, RewardScorer, score_grade  # noqa: F401
