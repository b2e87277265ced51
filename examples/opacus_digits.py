"""An Opacus training script, ported to renyi by changing its import line (and nothing else).

The structure is that of Opacus's MNIST example and tutorials: a small CNN, an SGD optimizer,
a ``DataLoader``, ``PrivacyEngine().make_private_with_epsilon(...)``, and the ordinary loop
``optimizer.zero_grad(); loss = criterion(model(data), target); loss.backward();
optimizer.step()`` for ``EPOCHS`` epochs, printing ε after each. The data are scikit-learn's
bundled 8×8 digits (no download). ``tests/test_dpsgd_opacus_script.py`` runs this file as it
is, and the same text with Opacus's import line, and compares them.

    python examples/opacus_digits.py --epochs 10 --epsilon 3
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from renyi.dpsgd import PrivacyEngine


class SampleConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.tanh(self.conv1(x)), 2)  # 8x8 -> 4x4
        x = F.max_pool2d(torch.tanh(self.conv2(x)), 2)  # 4x4 -> 2x2
        x = x.flatten(1)
        x = torch.tanh(self.fc1(x))
        return self.fc2(x)


def load_data(batch_size, test_batch_size):
    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    images = (images - 0.3) / 0.4
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    test_idx, train_idx = order[:360], order[360:]
    train = TensorDataset(images[train_idx], labels[train_idx])
    test = TensorDataset(images[test_idx], labels[test_idx])
    train_loader = DataLoader(train, batch_size=batch_size, shuffle=True)
    test_loader = DataLoader(test, batch_size=test_batch_size, shuffle=False)
    return train_loader, test_loader


def train(args, model, train_loader, optimizer, privacy_engine, epoch):
    model.train()
    criterion = nn.CrossEntropyLoss()
    losses = []
    for data, target in train_loader:
        optimizer.zero_grad()
        output = model(data)
        loss = criterion(output, target)
        loss.backward()
        optimizer.step()
        if len(target) > 0:
            losses.append(loss.item())
    epsilon = privacy_engine.accountant.get_epsilon(delta=args.delta)
    print(
        f"Train Epoch: {epoch} \tLoss: {np.mean(losses):.6f} (ε = {epsilon:.2f}, δ = {args.delta})"
    )
    return epsilon


def test(model, test_loader):
    model.eval()
    criterion = nn.CrossEntropyLoss()
    test_loss = 0.0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += criterion(output, target).item() * len(target)
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    n = len(test_loader.dataset)
    print(
        f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n} ({correct / n:.4f})"
    )
    return correct / n


def main():
    parser = argparse.ArgumentParser(description="DP-SGD on digits, Opacus style")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--max-per-sample-grad-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    train_loader, test_loader = load_data(args.batch_size, args.test_batch_size)
    model = SampleConvNet()
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0)

    privacy_engine = PrivacyEngine()
    model, optimizer, train_loader = privacy_engine.make_private_with_epsilon(
        module=model,
        optimizer=optimizer,
        data_loader=train_loader,
        epochs=args.epochs,
        target_epsilon=args.epsilon,
        target_delta=args.delta,
        max_grad_norm=args.max_per_sample_grad_norm,
    )
    print(f"Using sigma={optimizer.noise_multiplier:.4f} and C={args.max_per_sample_grad_norm}")

    for epoch in range(1, args.epochs + 1):
        train(args, model, train_loader, optimizer, privacy_engine, epoch)
    accuracy = test(model, test_loader)
    print(f"FINAL epsilon={privacy_engine.get_epsilon(args.delta):.6f} accuracy={accuracy:.4f}")


if __name__ == "__main__":
    main()
