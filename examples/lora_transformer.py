"""Private fine-tuning of a small transformer with LoRA adapters, written in plain torch.

The task ships with the packages (no download): tell lines of the Python language reference
(CPython's ``pydoc_data``) from lines of numpy's docstrings, byte by byte
(:func:`renyi.dpsgd.data.load_doc_lines`). The model is a 2-layer byte-level transformer
encoder written here (attention, feed-forward, LayerNorm); every weight of it is frozen and
LoRA adapters (Hu et al. 2022: ``W x + (α/r) B A x``, ``B`` initialised to zero) are added to
the query and value projections, with a trainable classification head. The optimizer is
built over ``model.parameters()`` as usual: the frozen weights in it are skipped by the
private optimizer. ``renyi.dpsgd.PrivacyEngine`` trains the adapters with DP-SGD for a
target (ε, δ) in the ordinary ``loss.backward(); optimizer.step()`` loop.

The frozen base here is randomly initialised — a stand-in for pretrained weights, which you
would load with ``--base-weights PATH`` (a ``state_dict`` of :class:`TinyTransformer`).

    python examples/lora_transformer.py --epochs 4 --epsilon 8
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader

from renyi.dpsgd import PrivacyEngine
from renyi.dpsgd.data import load_doc_lines


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) · B(A(x))`` with ``base`` frozen and ``B`` starting at 0."""

    def __init__(self, base: nn.Linear, rank: int = 4, alpha: float = 8.0) -> None:
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.lora_a.weight, std=1.0 / math.sqrt(base.in_features))
        nn.init.zeros_(self.lora_b.weight)
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scale * self.lora_b(self.lora_a(x))


class Block(nn.Module):
    """Pre-norm transformer block: multi-head self-attention (padding masked) and an MLP."""

    def __init__(self, d_model: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, hidden)
        self.ff2 = nn.Linear(hidden, d_model)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k, v = self._split(self.q(h)), self._split(self.k(h)), self._split(self.v(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v  # within one example only
        x = x + self.o(att.transpose(1, 2).flatten(2))
        return x + self.ff2(torch.nn.functional.gelu(self.ff1(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Byte-level encoder: embeddings + positions, ``layers`` blocks, masked mean pooling."""

    def __init__(
        self, seq_len: int = 48, d_model: int = 32, heads: int = 4, layers: int = 2
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(128, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        self.blocks = nn.ModuleList(Block(d_model, heads, 2 * d_model) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pad = tokens == 0
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, pad)
        keep = (~pad).unsqueeze(-1).to(x.dtype)
        pooled = (self.norm(x) * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return self.head(pooled)


def add_lora(model: TinyTransformer, rank: int = 4, alpha: float = 8.0) -> TinyTransformer:
    """Freeze every weight, put LoRA adapters on the query and value projections, and
    leave the adapters and the classification head trainable."""
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.blocks:
        assert isinstance(block, Block)
        block.q = LoRALinear(block.q, rank, alpha)  # type: ignore[assignment]
        block.v = LoRALinear(block.v, rank, alpha)  # type: ignore[assignment]
    for p in model.head.parameters():
        p.requires_grad_(True)
    return model


def run(argv: list[str] | None = None) -> tuple[nn.Module, dict[str, float]]:
    """Train as the command line says; returns the (wrapped) model and the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--per-class", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--accountant", default="prv")
    parser.add_argument("--base-weights", default=None)
    parser.add_argument("--seed", type=int, default=None, help="reproducible, insecure")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    train, test = load_doc_lines(per_class=args.per_class)
    model = TinyTransformer(seq_len=train.tensors[0].shape[1])
    if args.base_weights:
        model.load_state_dict(torch.load(args.base_weights, weights_only=True))
    model = add_lora(model, rank=args.rank)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    print(f"trainable parameters: {trainable} of {total} (LoRA rank {args.rank} + head)")

    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)  # frozen ones are skipped
    engine = PrivacyEngine(accountant=args.accountant)
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=optimizer,
        data_loader=DataLoader(train, batch_size=args.batch_size, shuffle=True),
        epochs=args.epochs,
        target_epsilon=args.epsilon,
        target_delta=args.delta,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
    )
    criterion = nn.CrossEntropyLoss()
    for epoch in range(1, args.epochs + 1):
        model.train()
        for tokens, labels in loader:
            optimizer.zero_grad()
            loss = criterion(model(tokens), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: ε = {engine.get_epsilon(args.delta):.3f}")
    model.eval()
    with torch.no_grad():
        tokens, labels = test.tensors
        accuracy = float((model(tokens).argmax(1) == labels).float().mean())
    result = {"epsilon": engine.get_epsilon(args.delta), "accuracy": accuracy}
    print(f"test accuracy {accuracy:.4f} at ε = {result['epsilon']:.3f}, δ = {args.delta}")
    return model, result


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run(argv)[1]


if __name__ == "__main__":
    main()
