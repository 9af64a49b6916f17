"""The training prompt and its worked examples (GRPO_PROMPT_EXAMPLES)."""
import pytest

from ocaml_grpo import prompting
from ocaml_grpo.prompting import ALL, END_MARKER, EXAMPLES, user_message

SIGNATURE = "(** Double it.\n * >>> double 2\n * 4\n*)\nlet double (x : int) : int ="


def test_the_default_prompt_carries_all_three_worked_examples():
    text = user_message(SIGNATURE)
    # what every earlier run trained on, byte for byte
    assert text == (f"{prompting.INSTRUCTIONS}\n\nExamples:\n\n{prompting.shots(3)}\n\nNow solve this problem.\n"
                    f"Problem:\n```ocaml\n{SIGNATURE}\n```\nAnswer with the ```ocaml block, then {END_MARKER}.")
    assert ALL == 3 and all(answer in text for _, answer in EXAMPLES) and user_message(SIGNATURE, 3) == text


@pytest.mark.parametrize("n", [0, 1, 2])
def test_fewer_examples_keep_the_rules_and_the_problem(n):
    text = user_message(SIGNATURE, n)
    assert text.startswith(prompting.INSTRUCTIONS) and SIGNATURE in text and text.endswith(f"then {END_MARKER}.")
    assert [answer in text for _, answer in EXAMPLES] == [i < n for i in range(len(EXAMPLES))]
    assert ("Examples:" in text) == (n > 0)
