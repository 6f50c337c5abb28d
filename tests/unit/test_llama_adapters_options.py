"""The native worker's LoRA and draft flags → ``xllamacpp.CommonParams``, read back field by
field; the LoRA fixture writes what llama.cpp's adapter loader reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.llama import DraftModel, LoraAdapter, parse_args

BASE = ["--model", "m.gguf", "--port", "1"]


def params(*flags: str):
    import xllamacpp  # noqa: F401  (the llama extra: absent is a broken install)

    from workers.llama import to_params

    return to_params(parse_args([*BASE, *flags]))


def test_adapters_keep_the_order_they_were_given_in_whichever_flag_named_them():
    """A request names an adapter by its place, so ``--lora`` and ``--lora-scaled`` share one
    list; both of llama-server's ``--lora-scaled`` forms, and its comma lists, are taken."""
    options = parse_args([*BASE, "--lora", "a.gguf,b.gguf", "--lora-scaled", "c.gguf:0.5",
                          "--lora-scaled", "d.gguf", "-0.25", "--lora", "e.gguf",
                          "--lora-scaled", "/x:y/f.gguf:2,g.gguf:0"])
    assert options.lora == (LoraAdapter("a.gguf"), LoraAdapter("b.gguf"),
                            LoraAdapter("c.gguf", 0.5), LoraAdapter("d.gguf", -0.25),
                            LoraAdapter("e.gguf"), LoraAdapter("/x:y/f.gguf", 2.0),
                            LoraAdapter("g.gguf", 0.0))
    assert not options.lora_init_without_apply and options.draft is None
    assert parse_args(BASE).lora == ()


@pytest.mark.parametrize("flags", [
    ["--lora-scaled", "a.gguf"],
    ["--lora-scaled", "a.gguf:many"],
    ["--lora-scaled", "a.gguf", "b.gguf", "0.5"],
    ["--lora-scaled", ":0.5"],
    ["--draft-max", "8"],
    ["-ngld", "4"],
    ["--model-draft", "d.gguf", "--draft-min", "9", "--draft-max", "8"],
    ["--model-draft", "d.gguf", "--draft-max", "eight"],
])
def test_malformed_adapter_and_draft_flags_are_refused(flags):
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*BASE, *flags])
    assert exit_info.value.code == 2


def test_adapters_become_lora_infos_at_their_scales():
    p = params("--lora", "a.gguf", "--lora-scaled", "b.gguf:0.5")
    assert [(a.path, a.scale) for a in p.lora_adapters] == [("a.gguf", 1.0), ("b.gguf", 0.5)]
    assert not p.lora_init_without_apply


def test_init_without_apply_loads_every_adapter_at_scale_0():
    """llama.cpp's flag alone leaves its server's slots at the adapters' scales: the worker
    starts them at 0 so a request without ``"lora"`` is the base model's."""
    p = params("--lora", "a.gguf", "--lora-scaled", "b.gguf:0.5", "--lora-init-without-apply")
    assert [(a.path, a.scale) for a in p.lora_adapters] == [("a.gguf", 0.0), ("b.gguf", 0.0)]
    assert p.lora_init_without_apply


def test_with_adapters_the_ram_prompt_cache_is_off():
    """Its entries do not record the adapters their KV was computed under."""
    assert params("--cache-ram", "512", "--lora", "a.gguf").cache_ram_mib == 0
    assert params("--cache-ram", "512").cache_ram_mib == 512
    assert params("--lora", "a.gguf", "--lora-init-without-apply").cache_ram_mib == 0


def test_a_draft_model_turns_on_draft_speculation_with_its_settings():
    import xllamacpp  # the llama extra, which the test command installs: absent is broken
    options = parse_args([*BASE, "--threads", "3", "-md", "d.gguf", "--draft-max", "8",
                          "--draft-min", "2", "--draft-p-min", "0.5", "-ngld", "5"])
    assert options.draft == DraftModel("d.gguf", 8, 2, 0.5, 5, 3)
    p = params("--threads", "3", "--model-draft", "d.gguf", "--draft-max", "8",
               "--draft-min", "2", "--draft-p-min", "0.5", "--gpu-layers-draft", "5")
    draft = p.speculative.draft
    assert draft.mparams.path == "d.gguf"
    assert (draft.n_max, draft.n_min, draft.p_min, draft.n_gpu_layers) == (8, 2, 0.5, 5)
    assert draft.cpuparams.n_threads == draft.cpuparams_batch.n_threads == 3
    assert p.speculative.types == [
        xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]


def test_llama_servers_draft_aliases_are_taken():
    assert parse_args([*BASE, "--spec-draft-model", "d", "--spec-draft-n-max", "4",
                       "--spec-draft-n-min", "1", "--spec-draft-p-min", "0.25",
                       "--spec-draft-ngl", "0"]).draft == DraftModel("d", 4, 1, 0.25, 0)
    assert parse_args([*BASE, "-md", "d", "--draft", "6"]).draft.n_max == 6
    assert parse_args([*BASE, "-md", "d", "--draft-n", "7"]).draft.n_max == 7


def test_an_unset_draft_setting_is_llama_cpps_own_and_a_cpu_model_keeps_its_draft_off_gpu():
    import xllamacpp  # the llama extra, which the test command installs: absent is broken
    defaults = xllamacpp.CommonParams().speculative.draft
    p = params("-ngl", "12", "-md", "d.gguf")
    draft = p.speculative.draft
    assert (draft.n_max, draft.n_min, draft.p_min, draft.n_gpu_layers) == (
        defaults.n_max, defaults.n_min, defaults.p_min, defaults.n_gpu_layers)
    assert params("-ngl", "0", "-md", "d.gguf").speculative.draft.n_gpu_layers == 0
    assert params("-ngl", "0", "-md", "d.gguf", "-ngld", "-1").speculative.draft \
        .n_gpu_layers == -1


def test_without_a_draft_model_nothing_is_speculated():
    import xllamacpp  # the llama extra, which the test command installs: absent is broken
    p = params()
    assert p.speculative.draft.mparams.path == "" and p.lora_adapters == []
    assert p.speculative.types == [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NONE]


def tiny_base(path: Path, arch: str = "llama") -> Path:
    """A two-block base with F32 attention weights (ggml ``[n_in, n_out]``)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny base")
    rng = np.random.default_rng(1)
    for block in range(2):
        writer.add_tensor(f"blk.{block}.attn_q.weight",
                          rng.standard_normal((16, 16)).astype(np.float32))
        writer.add_tensor(f"blk.{block}.attn_v.weight",
                          rng.standard_normal((8, 16)).astype(np.float32))  # n_out 8
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read(path: Path) -> tuple[dict, dict]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items()
              if not name.startswith("GGUF.")}
    return fields, {t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name)
                    for t in reader.tensors}


def test_the_lora_fixture_writes_what_llama_cpps_loader_reads(tmp_path):
    from tests.lora_fixtures import write_lora_gguf

    base = tiny_base(tmp_path / "base.gguf")
    adapter = write_lora_gguf(tmp_path / "a.gguf", base, rank=2, seed=3)
    fields, tensors = read(adapter)
    assert fields["general.type"] == "adapter" and fields["adapter.type"] == "lora"
    assert fields["general.architecture"] == "llama"
    assert fields["adapter.lora.alpha"] == 2.0  # alpha = rank: a request's scale as it is
    assert fields["general.base_model.count"] == 1
    assert fields["general.base_model.0.name"] == "tiny base"
    # ggml shapes: lora_a [n_in, rank], lora_b [rank, n_out]
    assert tensors == {
        f"blk.{b}.{w}.weight.lora_{ab}": (shape, "F32")
        for b in range(2) for w, n_out in (("attn_q", 16), ("attn_v", 8))
        for ab, shape in (("a", (16, 2)), ("b", (2, n_out)))}
    again = write_lora_gguf(tmp_path / "again.gguf", base, rank=2, seed=3)
    assert again.read_bytes() == adapter.read_bytes()
    other = write_lora_gguf(tmp_path / "other.gguf", base, rank=2, seed=4)
    assert other.read_bytes() != adapter.read_bytes()
    only_q = read(write_lora_gguf(tmp_path / "q.gguf", base, targets=("attn_q",)))[1]
    assert {name.split(".")[2] for name in only_q} == {"attn_q"}
    with pytest.raises(ValueError, match="ffn_up"):
        write_lora_gguf(tmp_path / "none.gguf", base, targets=("ffn_up",))


def test_the_broken_adapters_are_broken_the_way_they_say(tmp_path):
    from tests.lora_fixtures import write_broken_lora_gguf

    base = tiny_base(tmp_path / "base.gguf")
    fields, tensors = read(write_broken_lora_gguf(tmp_path / "arch.gguf", base))
    assert fields["general.architecture"] == "qwen2" and fields["general.type"] == "adapter"
    assert tensors["blk.0.attn_q.weight.lora_a"][0] == (16, 4)
    _, tensors = read(write_broken_lora_gguf(tmp_path / "shape.gguf", base, "shape"))
    assert tensors["blk.0.attn_q.weight.lora_a"][0] == (15, 4)  # one n_in short
    with pytest.raises(ValueError):
        write_broken_lora_gguf(tmp_path / "x.gguf", base, "colour")
