"""Media encoders (device code): per-family vision and audio towers with their projectors, and what they share
(encoders/attention.py, encoders/rope_2d.py, encoders/blocks.py, encoders/output.py). Their inputs are batched on the
host by the family's preprocess/<family>/<modality>_batch.py.

Shape suffixes (``x_BLD``) mean what they mean in the decoder (decoder/attention.py, decoder/kv_cache.py,
decoder/model.py), plus the letters the towers alone need:

    B  batch: the items of one encoder call (images, tiles, frame blocks, attention windows, clips, chunks)
    L  length: the tokens of one item (patches, frames, ...), the axis its attention runs over
    Q  query rows of one attention step (queries attended a block at a time)
    D  model width (the tower's hidden size; the output width where a projection says so)
    N  query heads;  K  kv heads;  H  head_dim;  G  query heads per kv head (N / K)
    R  feature rows of a whole batch (B x L flattened, ``EncoderOutput.features``)
    J  rotation angles of a token: head_dim / 2 (2-D RoPE)
    C  channels (of pixels or of a convolution's feature maps)
    Y, X  the two spatial axes of an image or a convolution's feature map (rows, columns)
    F  values of one flattened input patch (C * p * p; Qwen3-Omni: C * t * p * p, t frames per patch)
    M  mel bins of an audio frame
    U  audio chunks of one attention window (Qwen3-Omni)

Digits are literal sizes (``positions_BL2``: two coordinates per token).
"""
