"""Realistic inputs for the corpus models (scripts/build_corpus.py), made here from nothing but numpy and Pillow.

Each maker returns ``(inputs, labels)``: ``inputs`` maps a model input name to an array with the record
axis first (each record with its batch axis of 1 where the model has one), ``labels`` is one class per
record or ``None``.
"""

from __future__ import annotations

import numpy as np

WORDS = (
    "invoice",
    "total",
    "amount",
    "due",
    "date",
    "paid",
    "order",
    "number",
    "customer",
    "account",
    "balance",
    "quantity",
    "price",
    "tax",
    "shipping",
    "address",
    "street",
    "city",
    "phone",
    "email",
    "receipt",
    "item",
    "discount",
    "subtotal",
    "cash",
    "change",
    "card",
    "bank",
    "transfer",
    "reference",
    "payment",
    "method",
    "station",
    "platform",
    "ticket",
    "seat",
    "coach",
    "arrival",
    "departure",
    "gate",
)


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _text_line(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A grey image (H, W, 3) uint8 of a few words in dark ink on a light, slightly uneven background."""
    from PIL import Image, ImageDraw

    words = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 5))))
    if rng.random() < 0.4:
        words += f" {rng.integers(1, 9999)}.{rng.integers(0, 99):02d}"
    size = int(height * rng.uniform(0.55, 0.75))
    font = _font(size)
    _, top, right, bottom = font.getbbox(words)
    canvas = Image.new("RGB", (max(right + 8, 16), height), tuple(int(v) for v in rng.integers(200, 256, 3)))
    ink = tuple(int(v) for v in rng.integers(0, 70, 3))
    ImageDraw.Draw(canvas).text((4, (height - (bottom - top)) // 2 - top), words, font=font, fill=ink)
    line = canvas.resize((width, height)) if canvas.width > width else canvas
    out = np.full((height, width, 3), np.asarray(line)[0, 0], np.uint8)
    out[:, : line.width] = np.asarray(line)
    shade = np.linspace(0, rng.uniform(-25, 25), width)[None, :, None]
    noise = rng.normal(0, 4, out.shape)
    return np.clip(out + shade + noise, 0, 255).astype(np.uint8)


def _paddle_norm(image: np.ndarray) -> np.ndarray:
    """PaddleOCR's rec/cls preprocessing: (x / 255 - 0.5) / 0.5, HWC -> CHW."""
    return ((image.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def text_orientation(count: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Text lines 48x192 for the orientation classifier; every other one turned 180 degrees (label 1)."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(count):
        line = _text_line(rng, 48, 192)
        flip = i % 2
        images.append(_paddle_norm(line[::-1, ::-1] if flip else line)[np.newaxis])
        labels.append(flip)
    return {"x": np.stack(images)}, np.asarray(labels, np.int64)


def text_lines(count: int, seed: int) -> tuple[dict[str, np.ndarray], None]:
    """Text lines 48x320 for the CTC recognizer."""
    rng = np.random.default_rng(seed)
    return {"x": np.stack([_paddle_norm(_text_line(rng, 48, 320))[np.newaxis] for _ in range(count)])}, None


def text_pages(count: int, seed: int, height: int = 128, width: int = 192) -> tuple[dict[str, np.ndarray], None]:
    """Document crops with a few text lines, normalised as PaddleOCR's detector expects (ImageNet mean/std)."""
    rng = np.random.default_rng(seed)
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    pages = []
    for _ in range(count):
        page = np.full((height, width, 3), rng.integers(215, 250), np.float32)
        y = int(rng.integers(4, 16))
        while y + 22 < height:
            line_h = int(rng.integers(16, 24))
            line = _text_line(rng, line_h, int(rng.integers(width // 2, width - 8)))
            x = int(rng.integers(2, width - line.shape[1] + 1))
            page[y : y + line_h, x : x + line.shape[1]] = line
            y += line_h + int(rng.integers(4, 14))
        pages.append(((page / 255.0 - mean) / std).transpose(2, 0, 1)[np.newaxis])
    return {"x": np.stack(pages).astype(np.float32)}, None


def scenes(count: int, seed: int, size: int = 320) -> tuple[dict[str, np.ndarray], None]:
    """Natural-ish RGB scenes in [0, 1]: sky and ground gradients, textured blobs and people-like shapes."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        horizon = int(rng.integers(size // 3, 2 * size // 3))
        top, ground = rng.integers(90, 230, 3), rng.integers(30, 150, 3)
        rows = np.concatenate([np.linspace(top, top * 0.7, horizon), np.linspace(ground * 1.2, ground, size - horizon)])
        image = Image.fromarray(np.repeat(rows[:, None, :], size, 1).clip(0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(4, 10))):
            x, y = rng.integers(0, size, 2)
            w, h = rng.integers(size // 12, size // 3, 2)
            colour = tuple(int(v) for v in rng.integers(0, 256, 3))
            shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
            shape([int(x), int(y), int(x + w), int(y + h)], fill=colour)
        for _ in range(int(rng.integers(1, 4))):  # skin-toned figures: head and body
            x, y = int(rng.integers(20, size - 60)), int(rng.integers(20, size - 140))
            skin = (int(rng.integers(150, 240)), int(rng.integers(100, 190)), int(rng.integers(80, 160)))
            draw.ellipse([x + 12, y, x + 38, y + 30], fill=skin)
            draw.rounded_rectangle([x, y + 30, x + 50, y + 130], radius=12, fill=skin)
        image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 1.5))))
        pixels = np.asarray(image, np.float32) + rng.normal(0, 6, (size, size, 3))
        images.append((pixels.clip(0, 255) / 255.0).astype(np.float32).transpose(2, 0, 1)[np.newaxis])
    return {"images": np.stack(images)}, None


def speech(count: int, seed: int, samples: int = 576, rate: int = 16000) -> tuple[dict[str, np.ndarray], None]:
    """Speech-like 16 kHz chunks for the VAD: voiced harmonics under moving formants, fricative noise, silence.

    Silero VAD v5 reads 512 new samples plus 64 of context (576), with a zero LSTM state.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / rate
    chunks = []
    for i in range(count):
        kind = i % 3
        if kind == 0:  # voiced: a glottal pulse train shaped by two formants
            f0 = rng.uniform(90, 240) * (1 + 0.05 * np.sin(2 * np.pi * rng.uniform(2, 6) * t))
            phase = 2 * np.pi * np.cumsum(f0) / rate
            wave = sum(np.sin(k * phase) / k for k in range(1, 25))
            for formant in rng.uniform([400, 1100], [900, 2400]):
                wave = wave + 0.3 * np.sin(2 * np.pi * formant * t) * np.sin(phase)
            wave = wave * rng.uniform(0.05, 0.3) / np.abs(wave).max()
        elif kind == 1:  # fricative: high-passed noise
            noise = rng.normal(0, 1, samples)
            wave = (noise - np.convolve(noise, np.ones(8) / 8, "same")) * rng.uniform(0.01, 0.08)
        else:  # room noise only
            wave = rng.normal(0, rng.uniform(1e-4, 3e-3), samples)
        chunks.append(wave.astype(np.float32)[np.newaxis])
    return {
        "input": np.stack(chunks),
        "state": np.zeros((count, 2, 1, 128), np.float32),
        "sr": np.full((count,), rate, np.int64),
    }, None


def sentences(count: int, seed: int, length: int = 24) -> tuple[dict[str, np.ndarray], None]:
    """Token ids for a BERT-uncased vocabulary: [CLS] words [SEP] then padding, with the attention mask.

    Word ids are drawn from 1996..6000, the frequent whole words of the 30522-entry uncased vocabulary,
    with a Zipf-like preference for the most frequent.
    """
    rng = np.random.default_rng(seed)
    ids = np.zeros((count, 1, length), np.int64)
    mask = np.zeros((count, 1, length), np.int64)
    for i in range(count):
        words = int(rng.integers(5, length - 2))
        ranks = np.minimum(rng.zipf(1.3, words), 4004) - 1
        ids[i, 0, : words + 2] = [101, *(1996 + ranks), 102]
        mask[i, 0, : words + 2] = 1
    return {"input_ids": ids, "attention_mask": mask}, None


def digits(split: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """scikit-learn's 8x8 digits as 64 features in [0, 1].

    ``train``: the first 1200; ``calib``: 64 of those; ``test``: 48 held out.
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    features, labels = (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)
    part = {"train": slice(0, 1200), "calib": slice(0, 64), "test": slice(1200, 1248)}[split]
    return {"input": features[part][:, np.newaxis]}, labels[part]
