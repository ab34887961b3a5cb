#!/usr/bin/env python3
"""Regenerate worker/config/benchmark_speech.wav: real (synthesised) speech for the
transcription and translation benchmarks.

    apt-get install espeak-ng && python3 scripts/make_benchmark_speech.py

Noise leaves a speech decoder idle and overstates its throughput, so the benchmark sends speech.
espeak-ng writes 22.05 kHz; the clip is resampled to 8 kHz 16-bit mono (windowed-sinc low-pass,
pure Python) so it stays under 100 KB in git. Speech engines resample to 16 kHz themselves, and
telephone-band speech (< 4 kHz) keeps every word. Stdlib only; runs on the host at dev time.
"""

from __future__ import annotations

import array
import math
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

TEXT = ("A quick update on the project. Testing went well on Monday, "
        "so we plan to ship next week.")
VOICE, WORDS_PER_MINUTE = "en-us", 170
OUT_RATE = 8000
TAPS = 24  # half-width of the resampling kernel, in output samples
OUT = Path(__file__).resolve().parents[1] / "worker" / "workers" / "openai" / "benchmark_speech.wav"


def synthesise(text: str) -> tuple[array.array, int]:
    """espeak-ng's 16-bit mono samples for `text`, and their rate."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "-w", str(path), text],
                       check=True)
        with wave.open(str(path)) as clip:
            if clip.getsampwidth() != 2 or clip.getnchannels() != 1:
                raise SystemExit("espeak-ng did not write 16-bit mono PCM")
            samples = array.array("h", clip.readframes(clip.getnframes()))
            return samples, clip.getframerate()


def resample(samples: array.array, rate: int, out_rate: int) -> array.array:
    """Band-limited resampling: a Hann-windowed sinc with its cut-off at the lower Nyquist."""
    cutoff = min(rate, out_rate) / 2
    half = TAPS * rate / out_rate  # kernel half-width in input samples
    out = array.array("h")
    for n in range(int(len(samples) * out_rate / rate)):
        centre = n * rate / out_rate
        total = 0.0
        for k in range(max(0, math.ceil(centre - half)), min(len(samples), math.floor(centre + half) + 1)):
            x = (k - centre) / rate
            window = 0.5 + 0.5 * math.cos(math.pi * (k - centre) / half)
            sinc = 2 * cutoff / rate * (math.sin(2 * math.pi * cutoff * x) / (2 * math.pi * cutoff * x) if x else 1.0)
            total += samples[k] * sinc * window
        out.append(max(-32768, min(32767, round(total))))
    return out


def trim(samples: array.array, rate: int, floor: int = 300, keep: float = 0.1) -> array.array:
    """Drop the silence espeak-ng leaves at both ends, keeping `keep` seconds of it."""
    loud = [i for i, s in enumerate(samples) if abs(s) > floor]
    pad = int(keep * rate)
    return samples[max(0, loud[0] - pad):loud[-1] + pad] if loud else samples


def main() -> int:
    """Write the clip; print its length and size."""
    samples, rate = synthesise(TEXT)
    low = resample(trim(samples, rate), rate, OUT_RATE)
    with wave.open(str(OUT), "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(OUT_RATE)
        clip.writeframes(low.tobytes())
    print(f"{OUT}: {len(low) / OUT_RATE:.2f} s, {OUT.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
