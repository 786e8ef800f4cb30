"""The torch modules of :class:`~cape.models.CellTransformer`: tensors in, tensors out.

* :mod:`~cape.models.modules.backbone` — the shared skeleton (:class:`~cape.models.modules.backbone.Backbone`) and
  the network's shape (:class:`~cape.models.NetworkConfig`);
* :mod:`~cape.models.modules.scgpt`, :mod:`~cape.models.modules.scbert` — the two backbones;
* :mod:`~cape.models.modules.self_attention` — softmax (SDPA) and Performer self-attention with the encoding's hooks;
* :mod:`~cape.models.modules.heads` — decoders on the hidden states and cell pooling;
* :mod:`~cape.models.modules.dropout` — ``nn.Dropout`` with a mask four times cheaper to draw on CPU.
"""
