"""The shared-prefix forward (training/shared_prefix.py, GRPO_SHARED_PREFIX) gives TRL's own
log-probabilities, entropies, loss and LoRA gradients, with each group's prompt encoded once: on the
tiny Qwen2 model with LoRA, through TRL's fused LM head, for batches with padding (prompts and
answers of several lengths, rows shuffled as TRL shuffles them) and without it; and a GRPO run
through TRL's trainer takes the same steps with it as without it."""
import os

import pytest
import torch

from ocaml_grpo.config.settings import cache_dir
from ocaml_grpo.models.tiny import ensure_plumbing_model, plumbing_model_dir
from ocaml_grpo.training.shared_prefix import logps_and_entropies, pack, prompt_groups


@pytest.fixture(scope="module")
def lora_model(tmp_path_factory):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head
    os.environ.setdefault("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ))),
                                                 dtype=torch.float32)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))  # as TRL's trainer adds it
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.05)  # away from zero, so every LoRA weight has a gradient
    return model


def batch(prompt_lens: list[int], answer_lens: list[list[int]], width: int, seed: int):
    """TRL's layout: prompts left-padded to one width, answers right-padded to `width`, rows shuffled."""
    g = torch.Generator().manual_seed(seed)
    prompt_width = max(prompt_lens)
    rows, masks = [], []
    for n, answers in zip(prompt_lens, answer_lens):
        prompt = torch.randint(5, 200, (n,), generator=g)
        for a in answers:
            ids = torch.zeros(prompt_width + width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            ids[prompt_width - n:prompt_width], mask[prompt_width - n:prompt_width] = prompt, 1
            ids[prompt_width:prompt_width + a] = torch.randint(5, 200, (a,), generator=g)
            mask[prompt_width:prompt_width + a] = 1
            rows.append(ids)
            masks.append(mask)
    order = torch.randperm(len(rows), generator=g)
    return torch.stack(rows)[order], torch.stack(masks)[order]


def standard(model, ids, mask, keep):
    """TRL 1.16's forward (GRPOTrainer._get_per_token_logps_and_entropies)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def lora_grads(model, logps, mask, keep) -> dict[str, torch.Tensor]:
    model.zero_grad()
    weights = torch.linspace(-1, 1, logps.numel()).view_as(logps)  # an advantage-like weighting of every token
    loss = (logps * weights * mask[:, -keep:]).sum() / mask[:, -keep:].sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("prompt_lens,answer_lens,width", [
    ([9, 14, 5], [[6, 2, 11], [11, 11, 1], [3, 7, 9]], 11),  # padding: prompts and answers of several lengths
    ([12, 12], [[8, 8, 8, 8], [8, 8, 8, 8]], 8),               # no padding at all
])
def test_the_shared_prefix_forward_gives_trls_logprobs_loss_and_gradients(lora_model, prompt_lens, answer_lens, width):
    ids, mask = batch(prompt_lens, answer_lens, width, seed=len(prompt_lens))
    ref_logps, ref_ent = standard(lora_model, ids, mask, width)
    ref_loss, ref_grads = lora_grads(lora_model, ref_logps, mask, width)
    logps, ent = logps_and_entropies(lora_model, ids, mask, width, pad_id=0, compute_entropy=True)
    loss, grads = lora_grads(lora_model, logps, mask, width)
    answer = mask[:, -width:].bool()
    assert torch.allclose(logps[answer], ref_logps[answer], atol=1e-5)
    assert torch.allclose(ent[answer], ref_ent[answer], atol=1e-5)
    assert (logps[~answer] == 0).all()
    assert torch.allclose(loss, ref_loss, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and len(grads) == 5 * 2 * 2  # 5 modules x A, B x 2 layers
    for name in grads:
        assert torch.allclose(grads[name], ref_grads[name], atol=1e-6, rtol=1e-4), name


def test_each_prompt_is_encoded_once_and_answers_never_see_each_other():
    ids, mask = batch([6, 4], [[3, 1], [2, 2]], 3, seed=0)
    groups = prompt_groups(ids, mask, 3)
    assert sorted(map(len, groups)) == [2, 2]
    p = pack(ids, mask, 3, groups, pad_id=0)
    # per pack: the prompt less its last token once, then (last prompt token + answer) per row
    lengths = [(ids.size(1) - 3 - (mask[g[0], :-3] == 0).sum().item() - 1) + sum(1 + mask[r, -3:].sum().item() for r in g)
               for g in groups]
    assert p.input_ids.shape[1] == max(lengths)
    for g, rows in enumerate(groups):
        (r1, s1, n1), (r2, s2, n2) = [(r, *p.where[r][1:]) for r in rows]
        # a segment: the copy of the prompt's last token, then the answer. The second answer's segment
        # sees neither the first answer nor its copy of the last prompt token ...
        assert not p.mask[g, 0, s2:s2 + n2 + 1, s1:s1 + n1 + 1].any()
        assert p.mask[g, 0, s2:s2 + n2 + 1, 0].all()  # ... but it sees the prompt
        assert p.position_ids[g, s1] == p.position_ids[g, s2]  # both restart at the prompt's end
        assert p.shift_labels[g, s1:s1 + n1].tolist() == ids[r1, -3:][mask[r1, -3:].bool()].tolist()


def test_a_grpo_run_takes_the_same_steps_with_the_shared_prefix(tmp_path, cache_home, monkeypatch):
    """Two optimizer steps of TRL's trainer on the tiny model, the same seed and data, with and
    without GRPO_SHARED_PREFIX: the same losses and the same LoRA weights after them."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from ocaml_grpo.training import shared_prefix
    from ocaml_grpo.training.trainer import OcamlGRPOTrainer
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    packed_passes = []
    original = shared_prefix.logps_and_entropies
    monkeypatch.setattr(shared_prefix, "logps_and_entropies",
                        lambda *a, **kw: packed_passes.append(1) or original(*a, **kw))
    model_dir = ensure_plumbing_model(plumbing_model_dir(cache_dir(os.environ)))
    rows = [{"prompt": "let f x = " + "x + 1 :: " * n} for n in (2, 9, 30, 5)]

    def reward(completions, **_):
        return [float(len(c) % 5) for c in completions]

    def run(share: bool):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        args = GRPOConfig(output_dir=str(tmp_path / str(share)), per_device_train_batch_size=4, num_generations=2,
                          max_completion_length=10, max_steps=2, learning_rate=1.0, beta=0.0, logging_steps=1,
                          save_strategy="no", report_to=[], use_cpu=True, bf16=False, remove_unused_columns=False,
                          seed=0, gradient_accumulation_steps=2, num_iterations=2,  # old log-probs computed too
                          optim="sgd")  # Adam would turn round-off in a near-zero gradient into a whole step
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"],
                          task_type="CAUSAL_LM")
        t = OcamlGRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=AutoTokenizer.from_pretrained(model_dir), peft_config=lora, tracker=None,
                             share_prompts=share)
        t.train()
        losses = [h["loss"] for h in t.state.log_history if "loss" in h]
        return losses, {n: p.detach().clone() for n, p in t.model.named_parameters() if "lora" in n}

    losses, weights = run(False)
    assert not packed_passes
    shared_losses, shared_weights = run(True)
    assert len(packed_passes) == 1 + 2 * 2  # the generation's old log-probs, then each micro-batch's loss
    assert losses == pytest.approx(shared_losses, abs=1e-5)
    assert any((w != 0).any() for n, w in weights.items() if "lora_B" in n)  # the steps moved the weights
    for name, w in weights.items():
        assert torch.allclose(w, shared_weights[name], atol=1e-5), name
