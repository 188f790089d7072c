// voicewire demo page: one WebRTC call to the gateway.
// Audio arrives on a recvonly Opus track; protocol v1 JSON rides the "control" data channel.
// Plain JS, no build step. window.voicewire exposes the same actions for scripted tests.
"use strict";

const ICE_GATHER_CAP_MS = 5000; // Chromium may never reach "complete" without a usable interface
const CONNECT_TIMEOUT_MS = 10000;
const AUDIBLE_DBFS = -45; // the engine's onset threshold: above it, audio is audible
const ONSET_POLL_MS = 2; // AnalyserNode poll while a TTFA is pending; getStats is cached ~50 ms
const METER_POLL_MS = 33; // level history: ~30 bars per second
const STATS_POLL_MS = 1000;
const METER_FLOOR_DB = -60;
const TTFA_GIVE_UP_MS = 15000;
const HIGHLIGHT_POLL_MS = 20; // word highlight refresh: a word lasts ~250 ms
// The engine keeps this much of the lead-in before a turn's first audible sample, so the page,
// which hears the onset, puts the turn's sample 0 this far before it.
const LEAD_IN_MS = 10;

// Every server route sits under the page's base (/ or, behind a proxy, e.g. /voice/). This script
// is served from <base>static/app.js, so the base is one level above it: nothing is hard-coded.
const BASE_URL = new URL("../", document.currentScript.src);
const api = (path) => new URL(path, BASE_URL).href;

const $ = (id) => document.getElementById(id);

const state = {
  pc: null,
  channel: null,
  audioCtx: null,
  analyser: null,
  sample: null, // Float32Array for the analyser
  sessionId: null,
  hasTrack: false,
  playError: null,
  connected: false,
  nextTurn: 1,
  turns: new Map(), // turn_id -> turn record
  onset: null, // { turn, t0, timer } while a TTFA is being measured
  playhead: null, // { turn, timer }: the turn whose words are highlighted as this page plays them
  lastPlayed: null, // the turn the playhead last followed
  history: [], // recent peak levels, dBFS
  timers: [],
  lastTtfaMs: null,
};

// --- connection ---------------------------------------------------------------------------------
async function connect() {
  if (state.pc) return;
  setStatus("wait", "Connecting…");
  $("connect").disabled = true;
  // Created inside the click: browsers only start audio contexts after a user gesture.
  state.audioCtx = new AudioContext();
  const pc = new RTCPeerConnection();
  state.pc = pc;
  pc.addTransceiver("audio", { direction: "recvonly" });
  const channel = pc.createDataChannel("control");
  state.channel = channel;
  channel.onmessage = (e) => onMessage(JSON.parse(e.data));
  channel.onclose = () => disconnect("Channel closed");
  pc.ontrack = (e) => attachAudio(e.streams[0] || new MediaStream([e.track]));
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed") disconnect("Connection failed");
  };
  try {
    // The STUN/TURN servers the gateway was started with (its own peers use the same), set
    // before the offer starts gathering.
    const config = await rtcConfiguration();
    pc.setConfiguration({ iceServers: config.iceServers });
    const token = config.authRequired ? await sessionToken(config.tokenUrl) : null;
    await pc.setLocalDescription(await pc.createOffer());
    await gatheringComplete(pc, ICE_GATHER_CAP_MS);
    const offerUrl = token ? `${api("offer")}?token=${encodeURIComponent(token)}` : api("offer");
    const resp = await fetch(offerUrl, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: pc.localDescription.type }),
    });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error ? body.error.message : `HTTP ${resp.status}`);
    await pc.setRemoteDescription(body);
    await waitFor(() => state.sessionId && state.hasTrack, CONNECT_TIMEOUT_MS);
  } catch (err) {
    disconnect(`Could not connect: ${err.message || err}`, true);
    throw err;
  }
  state.connected = true;
  setStatus("on", "Connected");
  $("connect").textContent = "Disconnect";
  $("connect").disabled = false;
  $("speak").disabled = false;
  setHint("Type or paste text, then Speak.");
  state.timers.push(setInterval(pollStats, STATS_POLL_MS));
}

function disconnect(reason = "Disconnected", isError = false) {
  if (!state.pc) return;
  const { pc, channel } = state;
  state.pc = state.channel = null;
  for (const t of state.timers) clearInterval(t);
  state.timers = [];
  stopOnset();
  stopPlayhead();
  for (const turn of state.turns.values()) {
    if (turn.llmTimer) clearTimeout(turn.llmTimer);
    if (!turn.done) setResult(turn, "closed", "error");
  }
  channel.onclose = null;
  channel.close();
  pc.close();
  if (state.audioCtx) state.audioCtx.close();
  $("audio").srcObject = null;
  Object.assign(state, { audioCtx: null, analyser: null, sessionId: null, hasTrack: false, connected: false });
  setStatus(isError ? "err" : "off", isError ? "Error" : "Disconnected");
  setHint(reason, isError);
  $("connect").textContent = "Connect";
  $("connect").disabled = false;
  $("speak").disabled = true;
  $("barge").disabled = true;
}

async function rtcConfiguration() {
  const resp = await fetch(api("v1/rtc-configuration"));
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error ? body.error.message : `HTTP ${resp.status}`);
  return body; // { iceServers, authRequired, tokenUrl }
}

// A server with an API key takes a call only with a single-use session token, which only a
// backend holding the key can mint: the operator's endpoint (--demo-token-url) gives the page one.
async function sessionToken(tokenUrl) {
  if (!tokenUrl) {
    throw new Error(
      "this server needs a session token and names no endpoint to get one " +
        "(start it with --demo-token-url: README, Demo page with auth)",
    );
  }
  let resp;
  try {
    resp = await fetch(tokenUrl, { method: "POST", credentials: "include" });
  } catch (err) {
    throw new Error(`the token endpoint ${tokenUrl} cannot be reached (${err.message || err})`);
  }
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok || !body.token) throw new Error(`the token endpoint ${tokenUrl} gave no token (HTTP ${resp.status})`);
  return body.token;
}

function gatheringComplete(pc, capMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => pc.iceGatheringState === "complete" && done();
    pc.addEventListener("icegatheringstatechange", check);
    setTimeout(done, capMs);
  });
}

function waitFor(cond, ms) {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const tick = () => {
      if (cond()) return resolve();
      if (performance.now() - t0 > ms) return reject(new Error("timed out"));
      setTimeout(tick, 10);
    };
    tick();
  });
}

function attachAudio(stream) {
  // The <audio> element is the sink that makes Chromium decode the track; the analyser only listens.
  const audio = $("audio");
  audio.srcObject = stream;
  audio.play().catch((err) => {
    state.playError = String(err);
    setHint("The browser blocked audio: click the page, then Speak again.", true);
  });
  const ctx = state.audioCtx;
  if (ctx.state === "suspended") ctx.resume();
  const analyser = ctx.createAnalyser();
  analyser.fftSize = 1024; // 21 ms at 48 kHz
  ctx.createMediaStreamSource(stream).connect(analyser);
  state.analyser = analyser;
  state.sample = new Float32Array(analyser.fftSize);
  state.hasTrack = true;
  state.timers.push(setInterval(drawMeter, METER_POLL_MS));
}

// --- protocol -------------------------------------------------------------------------------------
function send(msg) {
  if (state.channel && state.channel.readyState === "open") state.channel.send(JSON.stringify(msg));
}

function onMessage(msg) {
  const turn = state.turns.get(msg.turn_id);
  switch (msg.type) {
    case "session.created":
      state.sessionId = msg.session_id;
      break;
    case "turn.started":
      if (turn) {
        setResult(turn, "playing", "playing");
        startPlayhead(turn);
      }
      break;
    case "turn.words":
      if (turn) {
        turn.words.push(...msg.words);
        if (state.playhead && state.playhead.turn === turn) renderWords(turn);
      }
      break;
    case "turn.done":
      if (turn) finishTurn(turn, msg);
      break;
    case "error":
      setHint(`${msg.code}: ${msg.message}`, true);
      if (turn && !turn.done) setResult(turn, msg.code, "error");
      break;
  }
}

// --- turns ------------------------------------------------------------------------------------------
function speak(text = $("text").value, opts = {}) {
  text = text.trim();
  if (!text || !state.connected) return null;
  const mode = opts.mode || document.querySelector("input[name=mode]:checked").value;
  const wordsPerS = opts.wordsPerS || Number($("rate").value);
  const idle = ![...state.turns.values()].some((t) => !t.done) && peakDbfs() < AUDIBLE_DBFS;
  const turn = { id: state.nextTurn++, text, sent: "", words: [], t0: null, done: null, ttfaMs: null, llmTimer: null };
  turn.row = addRow(turn);
  state.turns.set(turn.id, turn);
  $("barge").disabled = false;
  const t0 = performance.now();
  // TTFA only means something when nothing else is playing or queued.
  if (idle) startOnset(turn, t0);
  else turn.row.querySelector(".ttfa").textContent = "queued";
  if (mode === "llm") streamWords(turn, wordsPerS);
  else {
    sendText(turn, text);
    send({ type: "text.end", turn_id: turn.id });
  }
  return turn.id;
}

function streamWords(turn, wordsPerS) {
  // A simulated LLM: one word (with its trailing space) per text.delta.
  const words = turn.text.split(/\s+/);
  let i = 0;
  const next = () => {
    turn.llmTimer = null;
    if (turn.done || !state.connected) return;
    const last = i === words.length - 1;
    sendText(turn, last ? words[i] : words[i] + " ");
    i += 1;
    if (last) send({ type: "text.end", turn_id: turn.id });
    else turn.llmTimer = setTimeout(next, 1000 / wordsPerS);
  };
  next();
}

function sendText(turn, text) {
  // turn.words' char offsets index the text as sent: its deltas joined.
  turn.sent += text;
  send({ type: "text.delta", turn_id: turn.id, text });
}

function bargeIn() {
  for (const turn of state.turns.values()) {
    if (turn.done || turn.cancelSent) continue;
    if (turn.llmTimer) clearTimeout(turn.llmTimer);
    turn.cancelSent = true;
    send({ type: "turn.cancel", turn_id: turn.id });
  }
  $("barge").disabled = true;
}

function finishTurn(turn, msg) {
  turn.done = msg;
  if (turn.llmTimer) clearTimeout(turn.llmTimer);
  const m = msg.metrics || {};
  const cells = turn.row.children;
  cells[3].textContent = fmtMs(m.ttfp_ms);
  cells[4].textContent = fmtMs(m.engine_ttfp_ms);
  cells[5].textContent = fmtSeconds(msg.audio_ms);
  cells[6].textContent = fmtSeconds(msg.played_ms);
  setResult(turn, msg.reason, msg.reason);
  if (msg.reason === "cancelled") showHeard(turn, msg.text_spoken || "");
  if (state.playhead && state.playhead.turn === turn && msg.reason !== "completed" && msg.reason !== "length") {
    // Cut: the words stay highlighted as far as this page played them.
    highlight(turn, turn.t0 === null ? 0 : performance.now() - turn.t0);
    stopPlayhead();
  }
  if (state.onset && state.onset.turn === turn && turn.ttfaMs === null) {
    stopOnset();
    cells[2].textContent = "—";
  }
  if (![...state.turns.values()].some((t) => !t.done)) $("barge").disabled = true;
}

// --- TTFA: text sent -> first audible sample at this browser's output ---------------------------------
function startOnset(turn, t0) {
  stopOnset();
  const timer = setInterval(() => {
    const now = performance.now();
    if (peakDbfs() > AUDIBLE_DBFS) {
      turn.ttfaMs = now - t0;
      state.lastTtfaMs = turn.ttfaMs;
      turn.row.querySelector(".ttfa").textContent = fmtMs(turn.ttfaMs);
      $("stat-ttfa").textContent = fmtMs(turn.ttfaMs);
      stopOnset();
    } else if (now - t0 > TTFA_GIVE_UP_MS) stopOnset();
  }, ONSET_POLL_MS);
  state.onset = { turn, t0, timer };
}

function stopOnset() {
  if (state.onset) clearInterval(state.onset.timer);
  state.onset = null;
}

function levels() {
  // Peak and RMS of the last 21 ms the analyser heard, in dBFS.
  if (!state.analyser) return { peak: -120, rms: -120 };
  state.analyser.getFloatTimeDomainData(state.sample);
  let peak = 0;
  let sum = 0;
  for (const v of state.sample) {
    peak = Math.max(peak, Math.abs(v));
    sum += v * v;
  }
  const db = (x) => (x > 0 ? 20 * Math.log10(x) : -120);
  return { peak: db(peak), rms: db(Math.sqrt(sum / state.sample.length)) };
}

const peakDbfs = () => levels().peak;

// --- words: turn.words highlighted as this page plays them ---------------------------------------------
// A turn's word times count from its first sample. The page's clock for them starts at the first
// audible sample it hears after the turn's turn.started (the server sends it as the turn's audio
// starts going out), so the highlight follows this browser's playback, jitter buffer included. A
// turn queued behind another starts once that one's audio has played here, not on its tail.
function startPlayhead(turn) {
  const prev = state.lastPlayed;
  const notBefore = prev && prev.t0 !== null && prev.done ? prev.t0 + prev.done.played_ms : 0;
  stopPlayhead();
  state.lastPlayed = turn;
  renderWords(turn);
  const onset = setInterval(() => {
    if (performance.now() < notBefore || peakDbfs() <= AUDIBLE_DBFS) return;
    turn.t0 = performance.now() - LEAD_IN_MS;
    clearInterval(onset);
    state.playhead.timer = setInterval(() => {
      const playedMs = performance.now() - turn.t0;
      highlight(turn, playedMs);
      const last = turn.words[turn.words.length - 1];
      if (turn.done && (!last || playedMs > last.end_ms)) stopPlayhead();
    }, HIGHLIGHT_POLL_MS);
  }, ONSET_POLL_MS);
  state.playhead = { turn, timer: onset };
}

function stopPlayhead() {
  if (state.playhead) clearInterval(state.playhead.timer);
  state.playhead = null;
}

function renderWords(turn) {
  // The text as sent, each timed word in a span; text the server has not timed yet stays plain.
  const el = $("spoken");
  el.textContent = "";
  let at = 0;
  turn.words.forEach((w, i) => {
    if (w.char_start > at) el.append(turn.sent.slice(at, w.char_start));
    const span = document.createElement("span");
    span.className = "word";
    span.dataset.index = i;
    span.textContent = turn.sent.slice(w.char_start, w.char_end);
    el.append(span);
    at = Math.max(at, w.char_end);
  });
  el.append(turn.sent.slice(at));
  if (turn.t0 !== null) highlight(turn, performance.now() - turn.t0);
}

function highlight(turn, playedMs) {
  // A word is played once its end has played, current while it plays.
  for (const span of $("spoken").querySelectorAll(".word")) {
    const w = turn.words[span.dataset.index];
    span.classList.toggle("played", w.end_ms <= playedMs);
    span.classList.toggle("current", w.start_ms <= playedMs && playedMs < w.end_ms);
  }
}

// --- read-outs --------------------------------------------------------------------------------------
function drawMeter() {
  const db = levels().rms; // RMS reads like loudness; the onset detector uses the peak
  $("level-db").textContent = db <= -119 ? "−∞" : db.toFixed(0);
  const canvas = $("meter");
  const ctx = canvas.getContext("2d");
  const bars = Math.floor(canvas.width / 4);
  state.history.push(db);
  if (state.history.length > bars) state.history.splice(0, state.history.length - bars);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const mid = canvas.height / 2;
  ctx.fillStyle = "rgba(148, 163, 184, .25)";
  ctx.fillRect(0, mid, canvas.width, 1);
  state.history.forEach((v, i) => {
    const frac = Math.max(0, (v - METER_FLOOR_DB) / -METER_FLOOR_DB);
    const h = Math.max(1, frac * (canvas.height - 12));
    ctx.fillStyle = v > AUDIBLE_DBFS ? `hsl(${190 + 60 * frac}, 85%, ${55 + 10 * frac}%)` : "#334155";
    ctx.fillRect(i * 4, mid - h / 2, 3, h);
  });
}

async function audioStats() {
  if (!state.pc) return null;
  const out = { playError: state.playError, contextState: state.audioCtx && state.audioCtx.state };
  const report = await state.pc.getStats();
  report.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      for (const k of [
        "totalSamplesReceived", "audioLevel", "totalAudioEnergy", "totalSamplesDuration",
        "jitterBufferDelay", "jitterBufferTargetDelay", "jitterBufferEmittedCount", "concealedSamples",
        "silentConcealedSamples", "concealmentEvents", "packetsReceived", "packetsLost", "jitter",
      ]) out[k] = s[k];
      const codec = report.get(s.codecId);
      out.codec = codec ? codec.mimeType : null;
    }
    if (s.type === "candidate-pair" && s.nominated && s.state === "succeeded") {
      const local = report.get(s.localCandidateId);
      const remote = report.get(s.remoteCandidateId);
      out.pair = { local: local && local.address, remote: remote && remote.address };
    }
  });
  return out;
}

async function pollStats() {
  const s = await audioStats();
  if (!s || s.packetsReceived === undefined) return;
  const jb = s.jitterBufferEmittedCount ? (1000 * s.jitterBufferDelay) / s.jitterBufferEmittedCount : null;
  $("stat-jitter").textContent = jb === null ? "—" : `${jb.toFixed(0)} ms`;
  $("stat-packets").textContent = `${s.packetsReceived}${s.packetsLost ? ` (${s.packetsLost} lost)` : ""}`;
  const concealed = s.totalSamplesReceived ? (100 * s.concealedSamples) / s.totalSamplesReceived : 0;
  $("stat-concealed").textContent = `${concealed.toFixed(2)} %`;
}

// --- DOM helpers --------------------------------------------------------------------------------------
function addRow(turn) {
  const tr = document.createElement("tr");
  tr.innerHTML =
    '<td></td><td class="text-col"></td><td class="ttfa">…</td><td>…</td><td>…</td><td>…</td><td>…</td>' +
    '<td><span class="tag tag-playing">sent</span></td>';
  tr.children[0].textContent = turn.id;
  tr.children[1].textContent = turn.text.length > 90 ? turn.text.slice(0, 87) + "…" : turn.text;
  $("turns").querySelector("tbody").prepend(tr);
  $("turns-empty").classList.add("hidden");
  return tr;
}

function showHeard(turn, text) {
  // A cut turn: what the listener heard, the text to keep in an agent's context.
  const heard = document.createElement("div");
  heard.className = "heard";
  heard.textContent = `heard: “${text}”`;
  turn.row.children[1].append(heard);
}

function setResult(turn, label, kind) {
  const tag = turn.row.querySelector(".tag");
  tag.textContent = label;
  tag.className = `tag tag-${kind}`;
}

function setStatus(kind, label) {
  const el = $("status");
  el.className = `pill pill-${kind}`;
  el.textContent = label;
}

function setHint(text, isError = false) {
  const el = $("hint");
  el.textContent = text;
  el.style.color = isError ? "var(--danger)" : "";
}

const fmtMs = (v) => (v === undefined || v === null ? "—" : `${Math.round(v)} ms`);
const fmtSeconds = (ms) => (ms === undefined || ms === null ? "—" : `${(ms / 1000).toFixed(2)} s`);

// --- wiring ---------------------------------------------------------------------------------------------
$("connect").addEventListener("click", () => (state.pc ? disconnect() : connect().catch(() => {})));
$("speak").addEventListener("click", () => speak());
$("barge").addEventListener("click", bargeIn);
$("rate").addEventListener("input", () => ($("rate-out").textContent = `${$("rate").value} words/s`));
for (const radio of document.querySelectorAll("input[name=mode]")) {
  radio.addEventListener("change", () => {
    $("llm-options").classList.toggle("hidden", radio.value !== "llm" || !radio.checked);
  });
}
$("llm-options").classList.add("hidden");
window.addEventListener("pagehide", () => disconnect("Page closed"));
drawMeter();

window.voicewire = { connect, disconnect, speak, bargeIn, audioStats, peakDbfs, state, baseUrl: BASE_URL.href };
