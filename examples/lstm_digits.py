"""DP-SGD on an LSTM classifier, Opacus style: each 8×8 digit is a sequence of 8 rows.

``nn.LSTM`` (batch_first) reads the rows of scikit-learn's bundled digits (no download); a
linear head classifies the last hidden state. ``renyi.dpsgd.PrivacyEngine`` makes the model,
optimizer and loader private for a target (ε, δ); the loop is the ordinary
``loss.backward(); optimizer.step()``.

    python examples/lstm_digits.py --epochs 8 --epsilon 3
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader

from renyi.dpsgd import PrivacyEngine
from renyi.dpsgd.data import load_digits


class RowLSTM(nn.Module):
    """Rows of an image as a sequence: LSTM(8 → hidden), last hidden state → 10 classes."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size=8, hidden_size=hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        rows = images.flatten(1, 2)  # [B, 1, 8, 8] -> [B, 8 rows, 8 pixels]
        out, _ = self.lstm(rows)
        return self.head(out[:, -1])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--accountant", default="prv")
    parser.add_argument("--seed", type=int, default=None, help="reproducible, insecure")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    train, test = load_digits()
    model = RowLSTM()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
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
        for images, labels in loader:
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: ε = {engine.get_epsilon(args.delta):.3f}")
    model.eval()
    with torch.no_grad():
        images, labels = test.tensors
        accuracy = float((model(images).argmax(1) == labels).float().mean())
    result = {"epsilon": engine.get_epsilon(args.delta), "accuracy": accuracy}
    print(f"test accuracy {accuracy:.4f} at ε = {result['epsilon']:.3f}, δ = {args.delta}")
    return result


if __name__ == "__main__":
    main()
