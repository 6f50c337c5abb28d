// model-boss dashboard: the talk tab's microphone tap, an AudioWorklet. The context runs at
// the socket's rate (24 kHz), so the browser has resampled the microphone already: this turns
// its 128-frame quanta into 20 ms pieces of PCM16 mono and hands each to the page.

const FRAMES = 480;  // 20 ms at 24 kHz: the piece a microphone client sends

class PcmTap extends AudioWorkletProcessor {
  constructor() {
    super();
    this.piece = new Int16Array(FRAMES);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0]?.[0];  // the first channel: mono is asked for
    if (channel) {
      for (const sample of channel) {
        const clipped = Math.max(-1, Math.min(1, sample));
        this.piece[this.filled++] = clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff;
        if (this.filled === FRAMES) {
          this.port.postMessage(this.piece.buffer, [this.piece.buffer]);
          this.piece = new Int16Array(FRAMES);
          this.filled = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("pcm-tap", PcmTap);
