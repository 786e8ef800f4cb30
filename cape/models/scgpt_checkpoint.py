"""Import a published scGPT checkpoint directory into :class:`~cape.models.ScGPTBackbone`.

A scGPT model directory (e.g. ``scGPT_human``) holds ``args.json`` (``embsize``, ``nheads``, ``d_hid``,
``nlayers``, ...), ``vocab.json`` (``{token: index}`` with ``<pad>``, ``<cls>``, ``<eoc>``) and ``best_model.pt``
(a state dict). Attention weights come in two layouts: PyTorch's ``self_attn.in_proj_weight``/``in_proj_bias``
and flash-attention's packed ``self_attn.Wqkv.weight``/``Wqkv.bias`` (rows ``[q; k; v]`` in both, so the import
is a renaming). The positional encoding is new (scGPT has none): choose it with ``encoding=``; the imported
weights are those of ``encoder`` (gene embedding), ``value_encoder``, the transformer layers and, when present,
the expression ``decoder``. :meth:`CellTransformer.from_scgpt <cape.models.CellTransformer.from_scgpt>` wraps the
import in a :class:`~cape.models.CellTransformer`.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._errors import CapeInputError
from ..encodings import GenePositions
from .modules.backbone import NetworkConfig
from .modules.heads import ExprDecoder
from .modules.scgpt import ScGPTBackbone
from .tokenize import GeneVocab

logger = logging.getLogger("cape")

_LAYER = re.compile(r"^transformer_encoder\.layers\.(\d+)\.(.+)$")
# scGPT layer parameter suffix → ScGPTBackbone layer parameter suffix.
_ATTN_RENAMES = {
    "self_attn.in_proj_weight": "self_attn.in_proj.weight",
    "self_attn.in_proj_bias": "self_attn.in_proj.bias",
    "self_attn.Wqkv.weight": "self_attn.in_proj.weight",
    "self_attn.Wqkv.bias": "self_attn.in_proj.bias",
}
_LAYER_KEEP = ("self_attn.out_proj.", "linear1.", "linear2.", "norm1.", "norm2.")


@dataclass
class ScGPTImport:
    """Result of :func:`load_scgpt_checkpoint`.

    Attributes
    ----------
    backbone
        The backbone with the imported weights (positional-encoding parameters freshly initialised).
    network
        Its shape as ``args.json`` gives it (with the annotation head's ``n_layers_cls``, default 3).
    vocab
        The checkpoint's gene vocabulary (its indices are the backbone's gene ids).
    decoder
        The expression decoder when the checkpoint has ``decoder.fc.*`` weights, else None.
    args
        The parsed ``args.json``.
    layout
        ``"in_proj"`` or ``"Wqkv"``.
    unused
        Checkpoint keys not imported (classification/MVC/DAB heads and the like).
    """

    backbone: ScGPTBackbone
    network: NetworkConfig
    vocab: GeneVocab
    decoder: ExprDecoder | None
    args: dict[str, Any]
    layout: str
    unused: list[str] = field(default_factory=list)


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError... for a damaged file
        raise CapeInputError(f"cannot read the weights {path} ({type(err).__name__}): damaged or not a torch "
                             "checkpoint") from err
    for key in ("model_state_dict", "state_dict", "model"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CapeInputError(f"{path} does not hold a state dict of tensors")
    # DataParallel/DDP checkpoints prefix every key with "module."
    return {k.removeprefix("module."): v for k, v in state.items()}


def convert_scgpt_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor],
                                                                   str, list[str]]:
    """Rename scGPT keys: ``(backbone_state, decoder_state, layout, unused_keys)``."""
    backbone, decoder, unused = {}, {}, []
    layouts = set()
    for key, value in state.items():
        if key.startswith(("encoder.embedding.", "encoder.enc_norm.", "value_encoder.")):
            backbone[key] = value
            continue
        if key.startswith("decoder.fc."):
            decoder[key.removeprefix("decoder.")] = value
            continue
        m = _LAYER.match(key)
        if m:
            i, rest = m.groups()
            rest = rest.replace("self_attn._impl.", "self_attn.")
            if rest in _ATTN_RENAMES:
                layouts.add("Wqkv" if "Wqkv" in rest else "in_proj")
                backbone[f"layers.{i}.{_ATTN_RENAMES[rest]}"] = value
                continue
            if rest.startswith(_LAYER_KEEP):
                backbone[f"layers.{i}.{rest}"] = value
                continue
        unused.append(key)
    if len(layouts) > 1:
        raise CapeInputError("checkpoint mixes the 'in_proj_' and 'Wqkv' attention layouts")
    if not layouts:
        raise CapeInputError("checkpoint has no transformer_encoder attention weights (in_proj_weight or Wqkv)")
    return backbone, decoder, layouts.pop(), unused


def load_scgpt_checkpoint(directory: str | Path, *, encoding: str = "none",
                          encoding_options: dict[str, Any] | None = None, positions: GenePositions | None = None,
                          dropout: float | None = None, model_file: str = "best_model.pt") -> ScGPTImport:
    """Build an :class:`ScGPTBackbone` from a scGPT model directory and load its weights.

    Parameters
    ----------
    directory
        Folder with ``args.json``, ``vocab.json`` and ``best_model.pt``.
    encoding, encoding_options, positions
        The positional encoding to add (rows of ``positions`` = the checkpoint vocabulary).
    dropout
        Override ``args.json``'s dropout (e.g. 0 for inference).
    model_file
        Weights file name inside ``directory``.

    Raises
    ------
    CapeInputError
        Missing files, missing weights, or a weight whose shape does not match ``args.json``.
    """
    directory = Path(directory)
    for name in ("args.json", "vocab.json", model_file):
        if not (directory / name).is_file():
            raise CapeInputError(f"scGPT checkpoint directory {directory} lacks {name}")
    try:
        args = json.loads((directory / "args.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CapeInputError(f"cannot read {directory / 'args.json'} ({type(err).__name__})") from err
    if not isinstance(args, dict):
        raise CapeInputError(f"{directory / 'args.json'} must be a JSON object")
    missing = [k for k in ("embsize", "nheads", "nlayers") if k not in args]
    if missing:
        raise CapeInputError(f"{directory / 'args.json'} lacks {', '.join(missing)}")
    vocab = GeneVocab.from_json(directory / "vocab.json")
    style = args.get("input_emb_style", "continuous")
    if style != "continuous":
        raise CapeInputError(f"only scGPT's continuous value encoder is supported, checkpoint uses {style!r}")
    backbone_state, decoder_state, layout, unused = convert_scgpt_state(_read_state(directory / model_file))
    n_layers = int(args["nlayers"])
    found = {int(k.split(".")[1]) for k in backbone_state if k.startswith("layers.")}
    if found != set(range(n_layers)):
        raise CapeInputError(f"args.json says nlayers={n_layers} but the weights hold layers {sorted(found)}")
    network = NetworkConfig(d_model=int(args["embsize"]), n_heads=int(args["nheads"]), n_layers=n_layers,
                            d_ff=int(args.get("d_hid", args["embsize"])),
                            dropout=float(args.get("dropout", 0.0) if dropout is None else dropout),
                            n_cls_layers=int(args.get("n_layers_cls", 3)), integration="complement")
    backbone = ScGPTBackbone(len(vocab), vocab.pad_id, network=network, encoding=encoding,
                             encoding_options=encoding_options, positions=positions)
    own = backbone.state_dict()
    for key, value in backbone_state.items():
        if key not in own:
            raise CapeInputError(f"checkpoint weight {key!r} has no place in ScGPTBackbone")
        if tuple(own[key].shape) != tuple(value.shape):
            raise CapeInputError(
                f"checkpoint weight {key!r} has shape {tuple(value.shape)}, expected {tuple(own[key].shape)}"
            )
    absent = sorted(k for k in own if k not in backbone_state and not k.startswith("encoding."))
    if absent:
        raise CapeInputError(f"checkpoint lacks {len(absent)} backbone weight(s), e.g. {absent[0]!r}")
    backbone.load_state_dict(backbone_state, strict=False)
    decoder = None
    if decoder_state:
        decoder = ExprDecoder(backbone.d_model, 1)
        try:
            decoder.load_state_dict(decoder_state)
        except RuntimeError:
            logger.warning("scGPT expression decoder has an unexpected shape; not imported")
            unused.extend(f"decoder.{k}" for k in decoder_state)
            decoder = None
    logger.info("imported scGPT checkpoint %s (%s layout, %d layers, %d tokens); %d keys unused",
                directory, layout, n_layers, len(vocab), len(unused))
    return ScGPTImport(backbone=backbone, network=network, vocab=vocab, decoder=decoder, args=args, layout=layout,
                       unused=unused)
