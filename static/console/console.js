/* Veronica console: the live stream, panel refreshes and operator actions. No build step.
 *
 * Safety: text from events is only ever set with textContent. Panels are re-fetched as
 * server-rendered HTML (auto-escaped templates, markdown sanitized by nh3) from our own origin.
 */
(function () {
  "use strict";

  const body = document.body;
  const page = body.dataset.page;
  const slug = body.dataset.space;
  const memberName = body.dataset.member || null;
  const pageSeq = parseInt(body.dataset.seq || "0", 10);
  const TIMELINE_MAX = 300;
  const REPLAY_TIMELINE = 100;

  // --- helpers ----------------------------------------------------------------------------------

  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    if (meta && meta.content) return meta.content;
    const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }

  let toastTimer = null;
  function toast(text, kind) {
    const el = document.getElementById("toast");
    if (!el) return;
    el.textContent = text;
    el.dataset.kind = kind || "info";
    el.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(function () { el.hidden = true; }, kind === "error" ? 8000 : 3000);
  }

  async function api(method, url, data) {
    const opts = { method: method, credentials: "same-origin", headers: { "X-CSRFToken": csrfToken(), "Accept": "application/json" } };
    if (data !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(data);
    }
    const res = await fetch(url, opts);
    let payload = null;
    try { payload = await res.json(); } catch (e) { payload = null; }
    if (!res.ok) {
      const msg = payload && payload.error ? payload.error : (res.status + " " + res.statusText);
      const field = payload && payload.field ? payload.field + ": " : "";
      throw new Error(field + msg);
    }
    return payload;
  }

  function age(iso) {
    if (!iso) return "";
    const then = Date.parse(iso);
    if (isNaN(then)) return "";
    let s = Math.max(0, Math.floor((Date.now() - then) / 1000));
    if (s < 60) return s + "s";
    const m = Math.floor(s / 60); s = s % 60;
    if (m < 60) return m + "m " + String(s).padStart(2, "0") + "s";
    const h = Math.floor(m / 60);
    if (h < 48) return h + "h " + String(m % 60).padStart(2, "0") + "m";
    return Math.floor(h / 24) + "d";
  }

  function tickAges() {
    document.querySelectorAll("[data-since]").forEach(function (el) {
      el.textContent = age(el.dataset.since);
    });
  }

  // --- panels: re-fetch server-rendered fragments, debounced -----------------------------------------

  const panels = {};
  document.querySelectorAll("[data-panel]").forEach(function (el) {
    panels[el.dataset.panel] = { el: el, timer: null, inflight: false, again: false };
  });

  function refresh(names) {
    (names || []).forEach(function (name) {
      const p = panels[name];
      if (!p || p.timer) return;
      p.timer = setTimeout(function () { p.timer = null; load(name); }, 120);
    });
  }

  async function load(name) {
    const p = panels[name];
    if (p.inflight) { p.again = true; return; }
    p.inflight = true;
    try {
      const editor = p.el.querySelector("details[data-keep-open][open]");
      if (editor) { p.again = false; return; }  // never clobber an edit in progress
      const res = await fetch(p.el.dataset.src, { credentials: "same-origin", headers: { "Accept": "text/html" } });
      if (!res.ok || res.redirected) return;
      const html = await res.text();
      const nearBottom = p.el.scrollHeight - p.el.scrollTop - p.el.clientHeight < 40;
      p.el.innerHTML = html;  // our own server-rendered, sanitized fragment
      if (nearBottom) p.el.scrollTop = p.el.scrollHeight;
      tickAges();
    } catch (e) {
      /* the next event or reconnect refreshes again */
    } finally {
      p.inflight = false;
      if (p.again) { p.again = false; refresh([name]); }
    }
  }

  // panels the page leaves out (data-lazy: a placeholder) are fetched at once, like a refresh
  Object.keys(panels).forEach(function (name) {
    if (!panels[name].el.hasAttribute("data-lazy")) return;
    load(name).then(function () {
      const waiting = panels[name].el.querySelector(".lazy-wait");  // still the placeholder: the fetch failed
      if (waiting) waiting.textContent = "Could not load this panel; it loads again on the next change, or reload the page.";
    });
  });

  // which panels an event touches
  function panelsFor(ev) {
    const k = ev.kind || "";
    const out = [];
    if (page === "space") {
      if (/^(member|run|model|tool|usage|access|ops)\./.test(k)) out.push("roster", "usage");
      if (/^task\./.test(k)) out.push("tasks", "roster");
      if (/^(approval|question)\./.test(k)) out.push("approvals", "roster");
      if (/^blackboard\./.test(k)) out.push("blackboard");
      if (/^message\./.test(k)) out.push("messages");
    } else if (page === "member") {
      if (k === "agent.delta") return out;  // a preview: the live text is appended, no re-fetch
      const mine = ev.member === memberName;
      if (mine) out.push("header", "transcript");
      if (/^task\./.test(k) && ev.payload && ev.payload.assignee === memberName) out.push("header");
      if (/^skill\./.test(k) && (mine || !ev.member)) out.push("skills");
      if (mine && /schedule/.test(k)) out.push("schedule");
      if (mine && /memory/.test(k)) out.push("memory");
      if (mine && /^run\./.test(k)) out.push("runs");
      const p = ev.payload || {};
      if (/^message\./.test(k) && (p.sender === memberName || p.to === memberName)) out.push("chat");
      if ((mine && /^(budget\.|member\.budget|model\.called|ops\.alert)/.test(k)) || /^space\.budget/.test(k)) out.push("budget");
      if (mine && /^approval\.rule/.test(k)) out.push("approval_rules");
    }
    return out;
  }

  // --- the timeline: built from event payloads with textContent only -----------------------------

  function summary(ev) {
    const p = ev.payload || {};
    const k = ev.kind;
    if (k === "message.sent") return (p.sender || "?") + " → " + (p.to || "?") + (p.subject ? " [" + p.subject + "]" : "") + ": " + (p.body || "");
    if (k === "task.status") return "#" + p.task + " " + (p.title || "") + ": " + p.frm + " → " + p.to + (p.reason ? " (" + p.reason + ")" : "");
    if (k === "task.created") return "#" + p.task + " " + (p.title || "") + " by " + (p.creator || "?");
    if (k === "task.assigned") return "#" + p.task + " " + (p.title || "") + " → " + (p.assignee || "?");
    if (k === "approval.decided") return (p.tool || "") + " " + (p.status || "") + " by " + (p.by || "?") + (p.reason ? ": " + p.reason : "");
    if (k === "approval.requested") return (p.tool || p.tool_name || "") + " needs approval";
    if (k === "blackboard.updated") return "by " + (p.writer || "?") + " (" + p.chars + " chars)";
    if (k === "member.phase") return (p.phase || "") + (p.tool ? ":" + p.tool : "");
    if (k === "ops.alert") return (p.subject || "") + (p.body ? ": " + p.body : "");
    if (k === "agent.retry") return p.text || ("retrying: " + (p.reason || ""));
    const parts = [];
    Object.keys(p).forEach(function (key) {
      if (key === "member_name") return;
      const v = p[key];
      if (v === null || v === undefined || v === "" || typeof v === "object") return;
      parts.push(key + "=" + String(v));
    });
    return parts.join(" ");
  }

  function addToTimeline(ev) {
    const list = document.getElementById("timeline");
    if (!list) return;
    if (page === "member" && ev.member !== memberName) return;
    const li = document.createElement("li");
    li.dataset.seq = ev.seq;
    li.className = "ev kind-" + ev.kind.replace(/[^a-z0-9_-]/gi, "-") + (ev.kind === "ops.alert" ? " alert" : "");
    const time = document.createElement("time");
    const when = ev.created_at ? new Date(ev.created_at) : new Date();
    time.textContent = when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
    time.dateTime = ev.created_at || "";
    const kind = document.createElement("span");
    kind.className = "kind";
    kind.textContent = ev.kind;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = ev.member || "";
    const text = document.createElement("span");
    text.className = "text";
    const s = summary(ev);
    text.textContent = s.length > 400 ? s.slice(0, 400) + "…" : s;
    li.append(time, " ", kind, " ", who, " ", text);
    const run = (ev.payload || {}).run;
    if (/^(run|model)\./.test(ev.kind) && /^[0-9]+$/.test(String(run))) {  // the run's trace page
      const link = document.createElement("a");
      link.className = "run-link";
      link.href = "/spaces/" + encodeURIComponent(slug) + "/runs/" + run + "/";
      link.textContent = "trace";
      li.append(" ", link);
    }
    list.prepend(li);
    while (list.children.length > TIMELINE_MAX) list.removeChild(list.lastChild);
  }

  // --- live text: agent.delta previews a streaming reply until its agent.text (the persisted turn) -----

  function liveEntry(ev) {
    const list = document.getElementById("timeline");
    if (!list || (page === "member" && ev.member !== memberName)) return null;
    let li = list.querySelector('li[data-live="' + CSS.escape(ev.member || "") + '"]');
    if (!li) {
      li = document.createElement("li");
      li.className = "ev kind-agent-delta live";
      li.dataset.live = ev.member || "";
      const kind = document.createElement("span");
      kind.className = "kind";
      kind.textContent = "texting";
      const who = document.createElement("span");
      who.className = "who";
      who.textContent = ev.member || "";
      const text = document.createElement("span");
      text.className = "text";
      li.append(kind, " ", who, " ", text);
      list.prepend(li);
    }
    return li.querySelector(".text");
  }

  function liveTranscript() {
    const list = page === "member" ? document.querySelector("[data-panel='transcript'] ol.transcript") : null;
    if (!list) return null;
    let li = list.querySelector("li.turn.live");
    if (!li) {
      li = document.createElement("li");
      li.className = "turn role-assistant live";
      const meta = document.createElement("div");
      meta.className = "meta";
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.textContent = "assistant (live)";
      meta.append(badge);
      const text = document.createElement("div");
      text.className = "md live-text";
      li.append(meta, text);
      list.append(li);
    }
    return li.querySelector(".live-text");
  }

  function liveText(ev) {
    const p = ev.payload || {};
    [liveEntry(ev), ev.member === memberName ? liveTranscript() : null].forEach(function (el) {
      if (!el) return;
      if ((p.offset || 0) === 0) el.textContent = "";
      el.textContent += p.text || "";  // textContent only: model text is never HTML here
    });
  }

  function liveDone(ev) {
    const list = document.getElementById("timeline");
    const li = list && list.querySelector('li[data-live="' + CSS.escape(ev.member || "") + '"]');
    if (li) li.remove();
    if (ev.member === memberName) {
      const turn = document.querySelector("[data-panel='transcript'] li.turn.live");
      if (turn) turn.remove();
    }
  }

  function onEvent(ev) {
    if (ev.kind === "agent.delta") { liveText(ev); return; }
    if (ev.kind === "agent.text" || ev.kind === "agent.retry" || ev.kind === "tool.called" || ev.kind === "run.ended") liveDone(ev);
    addToTimeline(ev);
  }

  // --- the stream ----------------------------------------------------------------------------------

  function setStatus(state, text) {
    const el = document.getElementById("stream-status");
    if (!el) return;
    el.dataset.state = state;
    el.textContent = text;
  }

  function startStream() {
    let last = Math.max(0, pageSeq - REPLAY_TIMELINE);  // replay fills the timeline
    let backoff = 500;
    let sock = null;

    function connect() {
      const proto = location.protocol === "https:" ? "wss:" : "ws:";
      sock = new WebSocket(proto + "//" + location.host + "/ws/spaces/" + encodeURIComponent(slug) + "/?after=" + last);
      sock.onmessage = function (msg) {
        let data;
        try { data = JSON.parse(msg.data); } catch (e) { return; }
        if (data.type === "ready") {
          last = data.seq;  // the server's position (it clamps a client that is ahead of the table)
          backoff = 500;
          setStatus("live", "live");
          return;
        }
        if (data.type !== "event" || data.seq <= last) return;  // never apply an event twice
        last = data.seq;
        onEvent(data);
        if (data.seq > pageSeq) {  // older ones are already on the page
          refresh(panelsFor(data));
          if (data.kind === "ops.alert") toast(summary(data), "error");
        }
        window.veronicaLastSeq = last;
      };
      sock.onclose = function (e) {
        // the server ended this socket's credential (4401: logged out, token revoked) or access (4404)
        if (e.code === 4401) { setStatus("closed", "signed out: reload to log in"); return; }
        if (e.code === 4404) { setStatus("closed", "no access to this space any more"); return; }
        setStatus("reconnecting", "reconnecting…");
        setTimeout(connect, backoff);
        backoff = Math.min(backoff * 2, 15000);
      };
    }
    connect();
    window.veronicaStream = { get last() { return last; }, socket: function () { return sock; } };
  }

  // --- actions: buttons and forms talk to the JSON API ----------------------------------------------

  document.addEventListener("click", async function (e) {
    const btn = e.target.closest("[data-action='post']");
    if (!btn) return;
    e.preventDefault();
    if (btn.dataset.confirm && !window.confirm(btn.dataset.confirm)) return;
    btn.disabled = true;
    try {
      const data = btn.dataset.body ? JSON.parse(btn.dataset.body) : {};
      await api(btn.dataset.method || "POST", btn.dataset.url, data);
      toast("done", "ok");
      refresh((btn.dataset.refresh || "").split(/\s+/).filter(Boolean));
    } catch (err) {
      toast(err.message, "error");
    } finally {
      btn.disabled = false;
    }
  });

  document.addEventListener("submit", async function (e) {
    const form = e.target;
    if (form.matches("form[data-confirm]") && !window.confirm(form.dataset.confirm)) { e.preventDefault(); return; }
    if (!form.matches("[data-api-form]")) return;
    e.preventDefault();
    const data = {};
    new FormData(form).forEach(function (value, key) { data[key] = value; });
    (form.dataset.jsonInt || "").split(/\s+/).filter(Boolean).forEach(function (key) {
      if (!(key in data)) return;  // "" is null (the default); a non-integer goes as typed, for the verb to refuse
      const v = String(data[key]).trim();
      data[key] = v === "" ? null : (/^-?[0-9]+$/.test(v) ? parseInt(v, 10) : v);
    });
    const submit = form.querySelector("[type=submit]");
    if (submit) submit.disabled = true;
    try {
      await api(form.dataset.method || "POST", form.dataset.url, data);
      if (form.dataset.reset) {
        form.dataset.reset.split(/\s+/).forEach(function (name) { if (form.elements[name]) form.elements[name].value = ""; });
      }
      const editor = form.closest("details[data-keep-open]");
      if (editor) editor.open = false;
      toast("done", "ok");
      if (form.hasAttribute("data-reload")) { location.reload(); return; }
      refresh((form.dataset.refresh || "").split(/\s+/).filter(Boolean));
    } catch (err) {
      toast(err.message, "error");
    } finally {
      if (submit) submit.disabled = false;
    }
  });

  // ctrl/cmd + enter sends the chat
  document.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && e.target.id === "chat-body") {
      e.preventDefault();
      e.target.form.requestSubmit();
    }
  });

  document.querySelectorAll(".chat-log, .transcript-wrap").forEach(function (el) { el.scrollTop = el.scrollHeight; });
  tickAges();
  setInterval(tickAges, 1000);
  if (slug && (page === "space" || page === "member")) startStream();
})();
