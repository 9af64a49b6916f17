"""Everything the commands at the top of the repository import: OCaml source handling, problem
sets, prompts, generation engines, the demo model, the dataset audit and the report's plots.
The commands themselves (train.py, rewards.py, ocaml_sandbox.py, analyze.py, evaluate.py) stay at
the top so that a newcomer sees what to run."""
