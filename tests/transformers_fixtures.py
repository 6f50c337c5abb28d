"""Tiny random-weight models for the transformers worker, built here with ``save_pretrained``:
a sentence-transformers embedder (BERT, mean pooling) and a CrossEncoder reranker (BERT with
one label) over a small WordPiece vocabulary, a Wav2Vec2 CTC recogniser over letters, a
Whisper recogniser over a byte-level vocabulary with its special and timestamp tokens, a
VITS voice over letters, and a VibeVoice over bytes with reference voices in its ``voices/``
folder: every vocabulary written by the test. No hub access."""

from __future__ import annotations

import json
import os
from pathlib import Path

WORDS = ("the a cat dog sat on mat sun rose is was red blue big small paris france capital "
         "of city river what where who why how and or not in to it hello world sentence "
         "one two three four five model boss gpu queue").split()


def _tokenizer(workdir: Path):
    from transformers import BertTokenizerFast

    workdir.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = list("abcdefghijklmnopqrstuvwxyz0123456789.,?!") + \
        [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    (workdir / "vocab.txt").write_text("\n".join(specials + WORDS + letters) + "\n")
    return BertTokenizerFast(str(workdir / "vocab.txt"), model_max_length=128)


def _config(labels: int | None = None):
    from transformers import BertConfig

    extra = {"num_labels": labels} if labels else {}
    return BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=128, **extra)


def build_embedder(path: Path, hidden: int = 32, layers: int = 2) -> Path:
    """A sentence-transformers folder (modules.json, a BERT, mean pooling)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import BertModel

    try:  # where sentence-transformers 6 keeps them
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer

    torch.manual_seed(0)
    raw = path.parent / (path.name + "-bert")
    config = _config()
    config.hidden_size, config.num_hidden_layers = hidden, layers
    config.intermediate_size = hidden * 4
    config.num_attention_heads = max(1, hidden // 32)
    BertModel(config).save_pretrained(raw)
    _tokenizer(raw).save_pretrained(raw)
    word = Transformer(str(raw), max_seq_length=128)
    dimension = getattr(word, "get_embedding_dimension", None) or \
        word.get_word_embedding_dimension
    pooling = Pooling(dimension(), "mean")
    SentenceTransformer(modules=[word, pooling], device="cpu").save(str(path))
    return path


def build_reranker(path: Path) -> Path:
    """A CrossEncoder folder: BERT for sequence classification with one label."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(1)
    BertForSequenceClassification(_config(labels=1)).save_pretrained(path)
    _tokenizer(path).save_pretrained(path)
    return path


def build_recogniser(path: Path, hidden: int = 32, layers: int = 2) -> Path:
    """A Wav2Vec2 CTC model with its processor (feature extractor and letter tokenizer)."""
    import torch
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    path.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<unk>": 1, "|": 2,
             **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz'")}}
    (path / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = Wav2Vec2CTCTokenizer(str(path / "vocab.json"), unk_token="<unk>",
                                     pad_token="<pad>", word_delimiter_token="|")
    features = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                        do_normalize=True, return_attention_mask=False)
    Wav2Vec2Processor(feature_extractor=features, tokenizer=tokenizer).save_pretrained(path)
    torch.manual_seed(2)
    config = Wav2Vec2Config(
        vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=max(2, hidden // 64), intermediate_size=hidden * 2,
        conv_dim=(hidden,) * 7, conv_kernel=(10, 3, 3, 3, 3, 2, 2),
        conv_stride=(5, 2, 2, 2, 2, 2, 2), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, pad_token_id=0)
    Wav2Vec2ForCTC(config).save_pretrained(path)
    return path


WHISPER_LANGUAGES = ("en", "fr", "de")


def build_whisper(path: Path) -> Path:
    """A Whisper model (one encoder and one decoder layer) with its processor: a byte-level
    BPE vocabulary, the task, language and timestamp tokens, and a generation config that
    names them, as a downloaded Whisper has."""
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    path.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    merges = ["h e", "l l", "Ġ t", "Ġ a"]
    for merge in merges:
        vocab[merge.replace(" ", "")] = len(vocab)
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    end = "<|endoftext|>"
    tokenizer = WhisperTokenizer(str(path / "vocab.json"), str(path / "merges.txt"),
                                 unk_token=end, bos_token=end, eos_token=end, pad_token=end)
    specials = ["<|startoftranscript|>", *(f"<|{code}|>" for code in WHISPER_LANGUAGES),
                "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
                "<|nospeech|>", "<|notimestamps|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=80),
                     tokenizer=tokenizer).save_pretrained(path)
    ids = tokenizer.convert_tokens_to_ids
    torch.manual_seed(3)
    config = WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=80, d_model=32, encoder_layers=1,
        decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=1500,
        max_target_positions=64, pad_token_id=ids(end), bos_token_id=ids(end),
        eos_token_id=ids(end), decoder_start_token_id=ids("<|startoftranscript|>"),
        begin_suppress_tokens=None, suppress_tokens=None)
    model = WhisperForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=ids("<|startoftranscript|>"), eos_token_id=ids(end),
        pad_token_id=ids(end), bos_token_id=ids(end),
        no_timestamps_token_id=ids("<|notimestamps|>"),
        prev_sot_token_id=ids("<|startofprev|>"),
        lang_to_id={f"<|{code}|>": ids(f"<|{code}|>") for code in WHISPER_LANGUAGES},
        task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")},
        is_multilingual=True, max_initial_timestamp_index=50, max_length=24,
        suppress_tokens=[], begin_suppress_tokens=[ids(end)])
    model.save_pretrained(path)
    return path


def build_voice(path: Path) -> Path:
    """A VITS (MMS-TTS) voice over a letter vocabulary, 16 kHz."""
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    path.mkdir(parents=True, exist_ok=True)
    symbols = ["_", *" abcdefghijklmnopqrstuvwxyz'.,?!-", "<unk>"]
    (path / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(symbols)}))
    VitsTokenizer(str(path / "vocab.json"), pad_token="_", unk_token="<unk>", add_blank=True,
                  normalize=True, phonemize=False, is_uroman=False,
                  language="eng").save_pretrained(path)
    torch.manual_seed(4)
    config = VitsConfig(
        vocab_size=len(symbols), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        ffn_dim=32, flow_size=16, spectrogram_bins=33, upsample_initial_channel=32,
        upsample_rates=[8, 8], upsample_kernel_sizes=[16, 16], resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1, 3]], prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=1, posterior_encoder_num_wavenet_layers=1,
        duration_predictor_num_flows=2, duration_predictor_filter_channels=16,
        depth_separable_num_layers=2, sampling_rate=16000)
    VitsModel(config).save_pretrained(path)
    return path


# the chat template VibeVoice's checkpoints ship: the reference voices first, then the script
VIBEVOICE_TEMPLATE = """\
{%- set system_prompt = system_prompt | default(" Transform the text provided by various \
speakers into speech output, utilizing the distinct voice of each respective speaker.\\n") -%}
{{ system_prompt -}}
{%- set audio_bos_token = audio_bos_token | default("<|vision_start|>") %}
{%- set audio_eos_token = audio_eos_token | default("<|vision_end|>") %}
{%- set audio_token = audio_token | default("<|vision_pad|>") %}
{%- set ns = namespace(speakers_with_audio="") %}
{%- for message in messages %}
    {%- set role = message['role'] %}
    {%- set content = message['content'] %}
    {%- set has_audio = content | selectattr('type', 'equalto', 'audio') | list | length > 0 %}
    {%- if has_audio and role not in ns.speakers_with_audio %}
        {%- set ns.speakers_with_audio = ns.speakers_with_audio + role + "," %}
    {%- endif %}
{%- endfor %}

{%- if ns.speakers_with_audio %}
{{ " Voice input:\\n" }}
{%- for speaker in ns.speakers_with_audio.rstrip(',').split(',') %}
{%- if speaker %}
 Speaker {{ speaker }}:{{ audio_bos_token }}{{ audio_token }}{{ audio_eos_token }}{{ "\\n" }}
{%- endif %}
{%- endfor %}
{%- endif %}
 Text input:{{ "\\n" }}

{%- for message in messages %}
    {%- set role = message['role'] %}
    {%- set text_items = message['content'] | selectattr('type', 'equalto', 'text') | list %}
    {%- for item in text_items %}
 Speaker {{ role }}: {{ item['text'] }}{{ "\\n" }}
    {%- endfor %}
{%- endfor %}
 Speech output:{{ "\\n" }}{{ audio_bos_token }}"""
VIBEVOICE_VOICES = {"alice": 220.0, "bob": 330.0}  # the folder's voices: name → tone (Hz)


def build_vibevoice(path: Path) -> Path:
    """A VibeVoice (two Qwen2 layers of width 32, an acoustic codec with a hop of 800
    samples at 24 kHz, one diffusion layer and two diffusion steps) with its processor, and
    two reference voices in ``voices/``. Its language head is zero, so every step's argmax is
    the lowest valid id, which the vocabulary makes the audio token: it speaks until
    ``max_new_tokens`` (24 tokens: 0.8 s), and the diffusion head (seeded noise, conditioned
    on the voices) makes the audio."""
    import torch
    from transformers import (
        Qwen2TokenizerFast,
        VibeVoiceAcousticTokenizerFeatureExtractor,
        VibeVoiceConfig,
        VibeVoiceForConditionalGeneration,
        VibeVoiceProcessor,
    )
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    path.mkdir(parents=True, exist_ok=True)
    audio, bos, eos, end = "<|vision_pad|>", "<|vision_start|>", "<|vision_end|>", \
        "<|endoftext|>"
    vocab = {token: i for i, token in enumerate((audio, bos, eos, end))}
    for char in bytes_to_unicode().values():
        vocab[char] = len(vocab)
    tokenizer = Qwen2TokenizerFast(vocab=vocab, merges=[], unk_token=end, eos_token=end,
                                   pad_token=end)
    tokenizer.add_special_tokens({"additional_special_tokens": [bos, eos, audio]})
    hop = [10, 10, 8]  # 800 samples a token
    features = VibeVoiceAcousticTokenizerFeatureExtractor(sampling_rate=24000,
                                                          pad_to_multiple_of=800)
    VibeVoiceProcessor(feature_extractor=features, tokenizer=tokenizer,
                       chat_template=VIBEVOICE_TEMPLATE).save_pretrained(path)
    codec = {"hidden_size": 8, "kernel_size": 3, "num_filters": 4, "downsampling_ratios": hop,
             "depths": [1, 1, 1, 1]}
    ids = tokenizer.convert_tokens_to_ids
    torch.manual_seed(5)
    config = VibeVoiceConfig(
        text_config={"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": len(tokenizer),
                     "max_position_embeddings": 4096, "tie_word_embeddings": False},
        audio_config={"model_type": "vibevoice_acoustic_tokenizer", **codec},
        semantic_model_config={"model_type": "vibevoice_acoustic_tokenizer_encoder", **codec},
        diffusion_head_config={"num_hidden_layers": 1, "intermediate_size": 32,
                               "frequency_embedding_size": 16},
        pad_token_id=ids(end), eos_token_id=ids(end), audio_bos_token_id=ids(bos),
        audio_eos_token_id=ids(eos), audio_token_id=ids(audio))
    model = VibeVoiceForConditionalGeneration(config)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        # the codec's own init (std 0.01, layer scales 1e-6) makes every voice the same
        # features: scaled so that two recordings are told apart
        for name, weight in model.model.audio_tower.named_parameters():
            if "gamma" in name:
                weight.fill_(1.0)
            elif weight.dim() > 1:
                weight.normal_(0, weight[0].numel() ** -0.5)
    model.generation_config.max_new_tokens = 24
    model.generation_config.num_diffusion_steps = 2
    model.save_pretrained(path)
    (path / "voices").mkdir()
    for name, tone in VIBEVOICE_VOICES.items():
        (path / "voices" / f"{name}.wav").write_bytes(tone_clip(1.0, tone))
    return path


def tone_clip(seconds: float, tone: float, rate: int = 24000) -> bytes:
    """A WAV of one tone with a little noise (a stand-in for a speaker's recording)."""
    import io
    import wave

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(int(tone)).normal(0, 0.02, t.size)
    samples = 0.3 * np.sin(2 * np.pi * tone * t) + noise
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


# an upload's file type → (container, codec) FFmpeg writes it with
CLIP_FORMATS = {"wav": ("wav", "pcm_s16le"), "mp3": ("mp3", "libmp3lame"),
                "flac": ("flac", "flac"), "ogg": ("ogg", "libopus"),
                "webm": ("webm", "libopus"), "m4a": ("ipod", "aac")}


def speech_clip(seconds: float, kind: str = "wav", rate: int = 16000) -> bytes:
    """A synthesised clip (two tones, with pauses) as a file of that type, at 48 kHz stereo
    where the codec wants it: the worker resamples and mixes down."""
    import io

    import av
    import numpy as np

    container, codec = CLIP_FORMATS[kind]
    rate = 48000 if codec == "libopus" else rate
    t = np.arange(int(seconds * rate), dtype=np.float32) / rate
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.2 * np.sin(2 * np.pi * 330 * t)
    wave *= (np.sin(2 * np.pi * 0.5 * t) > -0.3)  # pauses
    stereo = np.ascontiguousarray(np.stack([wave, wave]).astype(np.float32))
    out = io.BytesIO()
    with av.open(out, mode="w", format=container) as file:
        stream = file.add_stream(codec, rate=rate, layout="stereo")
        frame = av.AudioFrame.from_ndarray(stereo, format="fltp", layout="stereo")
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=stream.codec_context.format.name,
                                      layout="stereo", rate=rate)
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(piece):
                file.mux(packet)
        for packet in stream.encode(None):
            file.mux(packet)
    return out.getvalue()


def shared(tmp_path_factory, name: str, build) -> Path:
    """``build(path)`` once per run however many test processes ask (see shared_tiny_sd)."""
    from filelock import FileLock

    from workers.process import collector_paused

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / f"shared-{name}"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not path.exists():
            partial = root / f"shared-{name}.partial"
            with collector_paused():  # torch and transformers come in: a quarter less CPU
                build(partial)
            partial.rename(path)
    return path
