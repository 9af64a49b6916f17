"""The training prompt, shared by train.py and evaluate.py so evaluation sees what training sees.

`examples` (GRPO_PROMPT_EXAMPLES, 0-3, default 3) is how many worked examples it carries. They are
~430 of a ~730-token prompt (SmolLM2's tokenizer): a model the SFT warm start taught the answer
format needs none of them, and on a CPU the prompt's tokens are most of what sampling and training
compute. SFT, GRPO and evaluation must build the prompt with the same number.
"""

END_MARKER = "(* END *)"

# Three short worked examples teach the answer shape the reward grades: one ```ocaml block holding
# the whole definition (signature line included), then the END marker. They are ~8 code lines
# because MIN_NON_EMPTY_LINES gates shorter answers.
INSTRUCTIONS = f"""You are an expert OCaml programmer. Complete the OCaml function described below.
Rules:
- Answer with ONE ```ocaml code block containing the complete definition, starting with the given `let` line.
- Use only the OCaml standard library unless the problem says otherwise; no printing, no top-level tests.
- Prefer tail recursion and pattern matching; the code must compile with ocamlc.
- After the code block, write {END_MARKER} on its own line and stop."""
EXAMPLES = [
    ("(** Sum of the squares of the integers in the list.\n * >>> sum_squares [1; 2; 3]\n * 14\n*)\n"
     "let sum_squares (xs : int list) : int =",
     "let sum_squares (xs : int list) : int =\n  let rec go acc rest =\n    match rest with\n    | [] -> acc\n"
     "    | x :: tl ->\n      let acc' = acc + (x * x) in\n      go acc' tl\n  in\n  go 0 xs"),
    ("(** Reverse a string.\n * >>> reverse_string \"abc\"\n * \"cba\"\n*)\nlet reverse_string (s : string) : string =",
     "let reverse_string (s : string) : string =\n  let n = String.length s in\n  let buf = Bytes.create n in\n"
     "  for i = 0 to n - 1 do\n    let c = s.[n - 1 - i] in\n    Bytes.set buf i c\n  done;\n"
     "  let result = Bytes.to_string buf in\n  result"),
    ("(** The largest element of the list, or None if it is empty.\n * >>> max_opt [3; 9; 2]\n * Some 9\n*)\n"
     "let max_opt (xs : int list) : int option =",
     "let max_opt (xs : int list) : int option =\n  let pick a b =\n    if a >= b then a else b\n  in\n"
     "  match xs with\n  | [] -> None\n  | x :: rest ->\n    let m = List.fold_left pick x rest in\n    Some m"),
]

ALL = len(EXAMPLES)  # the default: every worked example


def shots(n: int) -> str:
    return "\n\n".join(f"Problem:\n```ocaml\n{p}\n```\nAnswer:\n```ocaml\n{a}\n```\n{END_MARKER}" for p, a in EXAMPLES[:n])


def answer_text(code: str) -> str:
    """An answer in the shape the examples teach and the reward grades: one ```ocaml block, then the
    END marker. The SFT warm start trains on reference solutions written this way."""
    return f"```ocaml\n{code.strip()}\n```\n{END_MARKER}"


def user_message(problem_text: str, examples: int = ALL) -> str:
    worked = f"Examples:\n\n{shots(examples)}\n\nNow solve this problem.\n" if examples else ""
    return (f"{INSTRUCTIONS}\n\n{worked}Problem:\n```ocaml\n"
            f"{problem_text.strip()}\n```\nAnswer with the ```ocaml block, then {END_MARKER}.")


def chat_messages(problem_text: str, examples: int = ALL) -> list[dict]:
    return [{"role": "user", "content": user_message(problem_text, examples)}]


def prompt_ids(tokenizer, problem_text: str, examples: int = ALL) -> list[int]:
    """The chat prompt's token ids as the model sees them (template and generation prompt included)."""
    text = tokenizer.apply_chat_template(chat_messages(problem_text, examples), add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_token_count(tokenizer, problem_text: str, examples: int = ALL) -> int:
    return len(prompt_ids(tokenizer, problem_text, examples))
