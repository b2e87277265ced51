"""Private text classification written as an Opacus tutorial writes it; ported to renyi by
changing its import line (and nothing else).

Which software documentation is this line from: the Python language reference (CPython's
``pydoc_data``), numpy's docstrings, or the docstrings of standard-library modules? All three
ship with the installed packages (no download). Lines are read byte by byte (a public
vocabulary: nothing is learnt from the training data to tokenise it) into a small transformer
encoder built from ``nn.Embedding``, ``nn.Linear`` and ``nn.LayerNorm`` (the layers both
Opacus and renyi compute per-example gradients for), trained with
``PrivacyEngine().make_private_with_epsilon(...)``, a ``StepLR`` schedule and the ordinary
``loss.backward(); optimizer.step()`` loop. ``--checkpoint PATH`` saves
``privacy_engine.save_checkpoint(...)`` after every epoch; ``--resume`` continues from it.

    python examples/opacus_text.py --epochs 4 --epsilon 8
"""

import argparse
import inspect
import math
import pydoc_data.topics

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from renyi.dpsgd import PrivacyEngine

MAX_LEN = 64
STDLIB = (
    "os re json collections itertools functools pathlib shutil subprocess argparse logging "
    "textwrap unittest asyncio socket"
).split()


def doc_lines(texts):
    lines = (line.strip() for text in texts for line in text.splitlines())
    return {line for line in lines if len(line) >= 20 and line.isascii()}


def docstrings(module):
    found = [module.__doc__ or ""]
    for _, member in inspect.getmembers(module):
        doc = getattr(member, "__doc__", None)
        if isinstance(doc, str):
            found.append(doc)
    return found


def load_data(per_class, seed=0):
    import importlib

    sources = [
        doc_lines(pydoc_data.topics.topics.values()),
        doc_lines(docstrings(np)),
        doc_lines(d for name in STDLIB for d in docstrings(importlib.import_module(name))),
    ]
    # a line found in two sources has no single answer: drop it everywhere
    shared = set()
    for i, a in enumerate(sources):
        for b in sources[i + 1 :]:
            shared |= a & b
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for label, lines in enumerate(sources):
        lines = sorted(lines - shared)
        for i in rng.permutation(len(lines))[:per_class]:
            raw = lines[i].encode("ascii")[:MAX_LEN]
            rows.append(list(raw) + [0] * (MAX_LEN - len(raw)))
            labels.append(label)
    x = torch.tensor(rows, dtype=torch.long)
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.from_numpy(rng.permutation(len(y)))
    n_test = len(y) // 5
    return TensorDataset(x[order[n_test:]], y[order[n_test:]]), TensorDataset(
        x[order[:n_test]], y[order[:n_test]]
    )


class SelfAttention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, pad):
        b, t, d = x.shape
        split = lambda h: h.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        return self.out((torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, 2 * d_model)
        self.ff2 = nn.Linear(2 * d_model, d_model)

    def forward(self, x, pad):
        x = x + self.attn(self.norm1(x), pad)
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))


class TextClassifier(nn.Module):
    def __init__(self, d_model=32, heads=4, layers=2, classes=3):
        super().__init__()
        self.tokens = nn.Embedding(128, d_model)
        self.positions = nn.Embedding(MAX_LEN, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x):
        pad = x == 0
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        h = self.tokens(x) + self.positions(positions)
        for block in self.blocks:
            h = block(h, pad)
        keep = (~pad).unsqueeze(-1).float()
        pooled = (self.norm(h) * keep).sum(1) / keep.sum(1).clamp(min=1.0)
        return self.head(pooled)


def train(args, model, train_loader, optimizer, privacy_engine, epoch):
    model.train()
    criterion = nn.CrossEntropyLoss()
    losses = []
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(data), target)
        loss.backward()
        optimizer.step()
        if len(target) > 0:
            losses.append(loss.item())
    epsilon = privacy_engine.get_epsilon(args.delta)
    lr = optimizer.param_groups[0]["lr"]
    print(f"Train Epoch: {epoch} \tLoss: {np.mean(losses):.6f} lr={lr:.4g} (ε = {epsilon:.2f})")


def test(model, test_loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            correct += (model(data).argmax(dim=1) == target).sum().item()
    n = len(test_loader.dataset)
    print(f"Test set: Accuracy: {correct}/{n} ({correct / n:.4f})")
    return correct / n


def main():
    parser = argparse.ArgumentParser(description="DP text classification, Opacus style")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--per-class", type=int, default=1500)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--lr-decay", type=float, default=0.7)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--max-per-sample-grad-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=None, help="save after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this epoch")
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    train_data, test_data = load_data(args.per_class, args.seed)
    train_loader = DataLoader(train_data, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_data, batch_size=512)
    model = TextClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    privacy_engine = PrivacyEngine(accountant="rdp")
    model, optimizer, train_loader = privacy_engine.make_private_with_epsilon(
        module=model,
        optimizer=optimizer,
        data_loader=train_loader,
        epochs=args.epochs,
        target_epsilon=args.epsilon,
        target_delta=args.delta,
        max_grad_norm=args.max_per_sample_grad_norm,
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.lr_decay)
    print(f"Using sigma={optimizer.noise_multiplier:.4f} and C={args.max_per_sample_grad_norm}")

    start = 1
    if args.resume:
        checkpoint = privacy_engine.load_checkpoint(
            path=args.checkpoint, module=model, optimizer=optimizer
        )
        scheduler.load_state_dict(checkpoint["scheduler"])
        start = checkpoint["epoch"] + 1
        spent = privacy_engine.get_epsilon(args.delta)
        print(f"Resumed after epoch {checkpoint['epoch']} (ε = {spent:.2f})")
    for epoch in range(start, args.epochs + 1):
        train(args, model, train_loader, optimizer, privacy_engine, epoch)
        scheduler.step()
        if args.checkpoint:
            privacy_engine.save_checkpoint(
                path=args.checkpoint,
                module=model,
                optimizer=optimizer,
                checkpoint_dict={"epoch": epoch, "scheduler": scheduler.state_dict()},
            )
        if args.stop_after == epoch:
            return
    accuracy = test(model, test_loader)
    print(f"FINAL epsilon={privacy_engine.get_epsilon(args.delta):.6f} accuracy={accuracy:.4f}")


if __name__ == "__main__":
    main()
