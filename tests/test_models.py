"""The real models: the book's checkpoints load strictly, forward passes match, checkpointing is exact."""
import torch

from book_gpt import GPTModel as BookGPTModel
from planner.arch import family_of
from planner.config import GPT2Config, LlamaConfig
from planner.routines import build_model

BOOK_CFG = {"vocab_size": 101, "context_length": 24, "emb_dim": 32, "n_heads": 4, "n_layers": 2,
            "drop_rate": 0.1, "qkv_bias": True}


def test_book_state_dict_loads_strictly_and_matches(tmp_path):
    torch.manual_seed(0)
    book = BookGPTModel(BOOK_CFG)
    torch.save(book.state_dict(), tmp_path / "model.pth")
    ours = build_model(GPT2Config(**BOOK_CFG))
    result = ours.load_state_dict(torch.load(tmp_path / "model.pth", weights_only=True), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randint(0, 101, (2, 16))
    book.eval(), ours.eval()
    with torch.no_grad():
        assert torch.equal(book(x), ours(x))
        sdpa = build_model(GPT2Config(**BOOK_CFG, attention="sdpa"))
        sdpa.load_state_dict(ours.state_dict(), strict=True)
        sdpa.eval()
        torch.testing.assert_close(sdpa(x), ours(x), rtol=1e-4, atol=1e-5)


def test_training_forward_is_the_books_op_for_op():
    """Same RNG stream, same dropout masks: the book's code and ours give the same training loss."""
    torch.manual_seed(0)
    book = BookGPTModel(BOOK_CFG)
    ours = build_model(GPT2Config(**BOOK_CFG))
    ours.load_state_dict(book.state_dict())
    x = torch.randint(0, 101, (2, 16))
    torch.manual_seed(1)
    a = book(x)
    torch.manual_seed(1)
    b = ours(x)
    assert torch.equal(a, b)


def test_checkpointing_gives_identical_gradients():
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    plain = build_model(cfg)
    ckpt = build_model(cfg)
    ckpt.load_state_dict(plain.state_dict())
    family_of(cfg).enable_checkpointing(ckpt)
    assert all(layer.gradient_checkpointing for layer in ckpt.model.layers)
    x = torch.randint(0, 50, (2, 8))
    for m in (plain, ckpt):
        m.train()
        m(input_ids=x, labels=x).loss.backward()
    for (n, p), (_, q) in zip(plain.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_llama_is_transformers_own_model():
    from transformers import LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, attention="eager")
    m = build_model(cfg)
    assert type(m) is LlamaForCausalLM
    assert m.config._attn_implementation == "eager" and m.config.num_key_value_heads == 2


def test_tied_llama_shares_the_embedding_and_bf16_build():
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, tie_word_embeddings=True)
    m = build_model(cfg, dtype="bfloat16")
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    assert m(input_ids=torch.randint(0, 50, (1, 5))).logits.shape == (1, 5, 50)
