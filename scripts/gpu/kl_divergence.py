#!/usr/bin/env python3
"""Mean KL divergence between two Kimi-Linear checkpoints' next-token distributions.

Loads each checkpoint the way ../shared/ref/kimi_ref.py does (MXFP4 experts dequantized on
load, through transformers' own Kimi-Linear), runs one fixed token sequence through both in
fp32 and reports KL(P_ref || P_test) at every position, its mean and max, and how often the
argmax agrees.  Usage: kl_divergence.py REF_DIR TEST_DIR [--tokens N] [--seed S] [--ref-py PATH]
"""
import argparse, json, pathlib, sys, tempfile

def load(model_dir, kimi_ref, dev):
    import torch
    from safetensors.torch import save_file
    from transformers import KimiLinearConfig, KimiLinearForCausalLM
    d = pathlib.Path(model_dir)
    cfg = KimiLinearConfig.from_dict(json.loads((d / "config.json").read_text()))
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    state = kimi_ref.load_state(d)
    with tempfile.TemporaryDirectory() as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(pathlib.Path(tmp) / "model.safetensors"))
        cfg.save_pretrained(tmp)
        model, info = KimiLinearForCausalLM.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        sys.exit(f"{model_dir}: does not match the reference model: {bad}")
    return model.to(dev).eval(), cfg

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref"); ap.add_argument("test")
    ap.add_argument("--tokens", type=int, default=128); ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ref-py", default=".ref")
    a = ap.parse_args()
    sys.path.insert(0, a.ref_py)
    import kimi_ref, torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref, cfg = load(a.ref, kimi_ref, dev)
    test, _ = load(a.test, kimi_ref, dev)
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, cfg.vocab_size - 256, (1, a.tokens), generator=g).to(dev)
    with torch.no_grad():
        lp = torch.log_softmax(ref(ids, use_cache=False).logits[0].float(), -1)
        lq = torch.log_softmax(test(ids, use_cache=False).logits[0].float(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    agree = (lp.argmax(-1) == lq.argmax(-1)).float().mean()
    print(json.dumps({"ref": a.ref, "test": a.test, "positions": a.tokens,
                      "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                      "argmax_agreement": float(agree)}))

if __name__ == "__main__":
    main()
