"""The group's prompt once: a shared-prefix forward for GRPO's log-probabilities (GRPO_SHARED_PREFIX).

A GRPO group's G answers share their prompt, and TRL encodes it G times: in the loss's forward and
backward and in every log-probability pass. Here the rows that hold the same prompt are packed into
one sequence, as Prefix Grouper does (Liu et al. 2025, arXiv 2506.05433):

    [prompt without its last token] [last prompt token, answer 1] [last prompt token, answer 2] ...

with an attention mask under which each answer's segment sees the shared prompt and itself
(causally), never another answer, and position ids that restart at the prompt's length in each
segment. Each token then has exactly the hidden state of the standard forward, so the
log-probabilities, entropies and gradients are the standard ones up to float round-off (tested).
The prompt's last token is repeated in each segment because its output predicts each answer's first
token: one position, one label. Padding is never encoded.

The packed rows go through TRL's fused LM head (`shift_labels`: each position's next-token label),
so the vocabulary projection and the log-softmax are TRL's own. Rows are grouped by their prompt's
tokens wherever they sit in the batch (TRL shuffles a generation batch before splitting it).
Not covered: multimodal inputs (the caller keeps TRL's forward for them).
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch


@dataclass
class Packed:
    input_ids: torch.Tensor        # (packs, L)
    position_ids: torch.Tensor     # (packs, L)
    mask: torch.Tensor             # (packs, 1, L, L) bool: True where a token may attend
    shift_labels: torch.Tensor     # (packs, L): the token each position predicts, -100 where none
    # for each batch row: (pack, first packed index of its answer's predictions, answer length)
    where: list[tuple[int, int, int]]


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> list[list[int]]:
    """The batch's rows grouped by their prompt's tokens (padding left out), in first-seen order."""
    prompt_len = input_ids.size(1) - logits_to_keep
    groups: dict[tuple, list[int]] = {}
    for row in range(input_ids.size(0)):
        key = tuple(input_ids[row, :prompt_len][attention_mask[row, :prompt_len].bool()].tolist())
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, groups: list[list[int]],
         pad_id: int) -> Packed:
    """`groups` of rows (prompt_groups) as one packed sequence each, right-padded to the longest."""
    prompt_len = input_ids.size(1) - logits_to_keep
    seqs, positions, labels, segments, where = [], [], [], [], [None] * input_ids.size(0)
    for g, rows in enumerate(groups):
        r0 = rows[0]
        prompt = input_ids[r0, :prompt_len][attention_mask[r0, :prompt_len].bool()].tolist()
        n_prompt = len(prompt)
        ids, pos, lab, seg = prompt[:-1], list(range(n_prompt - 1)), [-100] * (n_prompt - 1), [0] * (n_prompt - 1)
        for k, row in enumerate(rows, 1):
            answer = input_ids[row, prompt_len:][attention_mask[row, prompt_len:].bool()].tolist()
            where[row] = (g, len(ids), len(answer))
            ids += [prompt[-1]] + answer
            pos += list(range(n_prompt - 1, n_prompt + len(answer)))
            lab += answer + [-100]
            seg += [k] * (len(answer) + 1)
        seqs.append(ids)
        positions.append(pos)
        labels.append(lab)
        segments.append(seg)
    width = max(map(len, seqs))
    dev = input_ids.device
    pad = lambda xs, v: torch.tensor([x + [v] * (width - len(x)) for x in xs], device=dev)  # noqa: E731
    seg = pad(segments, -1)
    causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
    q, k = seg[:, :, None], seg[:, None, :]
    mask = causal & ((k == 0) | (q == k)) & (q >= 0) & (k >= 0)  # a segment sees the prompt and itself
    mask |= torch.eye(width, dtype=torch.bool, device=dev)  # padding attends to itself (no empty softmax row)
    return Packed(pad(seqs, pad_id), pad(positions, 0), mask[:, None], pad(labels, -100), where)


def logps_and_entropies(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        pad_id: int, batch_size: int | None = None, compute_entropy: bool = False,
                        autocast=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """TRL's per-token log-probabilities (and entropies) of the answers, shaped (rows, logits_to_keep)
    with zeros past each answer, from shared-prefix forwards. `model` carries TRL's fused LM head;
    `batch_size`: rows per forward, as TRL chunks (whole groups); `autocast`: the trainer's mixed
    precision context (accelerator.autocast), else the caller's own."""
    groups = prompt_groups(input_ids, attention_mask, logits_to_keep)
    rows_per_chunk = batch_size or input_ids.size(0)
    chunks, current = [], []
    for g in groups:
        if current and sum(map(len, current)) + len(g) > rows_per_chunk:
            chunks.append(current)
            current = []
        current.append(g)
    chunks.append(current)
    entropies = None
    out_logps, out_entropies, index = [], [], []
    for chunk in chunks:
        p = pack(input_ids, attention_mask, logits_to_keep, chunk, pad_id)
        with autocast() if autocast else nullcontext():
            out = model(input_ids=p.input_ids, position_ids=p.position_ids, attention_mask=p.mask,
                        shift_labels=p.shift_labels, fused_lm_head=True)
        for rows in chunk:
            for row in rows:
                g, start, n = p.where[row]
                index.append((row, n))
                out_logps.append(out.log_probs[g, start:start + n])
                if compute_entropy:
                    out_entropies.append(out.entropy[g, start:start + n])
    # rebuilt with differentiable ops: the loss's gradient flows back through these
    rows = [torch.nn.functional.pad(x, (0, logits_to_keep - n)) for (_, n), x in zip(index, out_logps)]
    order = torch.tensor([r for r, _ in index], device=input_ids.device)
    logps = torch.stack(rows).index_select(0, torch.argsort(order))
    if compute_entropy:
        ents = [torch.nn.functional.pad(x, (0, logits_to_keep - n)) for (_, n), x in zip(index, out_entropies)]
        entropies = torch.stack(ents).index_select(0, torch.argsort(order))
    return logps, entropies
