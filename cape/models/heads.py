"""Task heads on top of a backbone's hidden states (parameter names as scGPT's decoders)."""

from __future__ import annotations

from torch import Tensor, nn


class ExprDecoder(nn.Module):
    """Per-token masked value prediction: MLP ``d → d → d → n_outputs`` with LeakyReLU (scGPT's ``ExprDecoder``).

    ``n_outputs = 1`` regresses the binned value (scGPT); ``n_outputs = n_levels`` gives logits over expression
    levels (scBERT's masked token prediction).
    """

    def __init__(self, d_model: int, n_outputs: int = 1) -> None:
        super().__init__()
        self.n_outputs = int(n_outputs)
        self.fc = nn.Sequential(nn.Linear(d_model, d_model), nn.LeakyReLU(), nn.Linear(d_model, d_model),
                                nn.LeakyReLU(), nn.Linear(d_model, self.n_outputs))

    def forward(self, hidden: Tensor) -> Tensor:
        """``(B, L, d)`` → ``(B, L)`` values or ``(B, L, n_outputs)`` logits."""
        out = self.fc(hidden)
        return out.squeeze(-1) if self.n_outputs == 1 else out


class ClsDecoder(nn.Module):
    """Cell classifier on the ``<cls>`` embedding: ``(n_layers − 1) × [Linear, ReLU, LayerNorm]`` + Linear."""

    def __init__(self, d_model: int, n_classes: int, n_layers: int = 3) -> None:
        super().__init__()
        self._decoder = nn.ModuleList()
        for _ in range(n_layers - 1):
            self._decoder.extend([nn.Linear(d_model, d_model), nn.ReLU(), nn.LayerNorm(d_model)])
        self.out_layer = nn.Linear(d_model, n_classes)

    def forward(self, cell_embedding: Tensor) -> Tensor:
        x = cell_embedding
        for layer in self._decoder:
            x = layer(x)
        return self.out_layer(x)
