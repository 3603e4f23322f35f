// The ccw dashboard's page. Every string shown came from the journal, and much of it
// from inside a capsule (argv, paths, hosts, output): it is set with textContent (el,
// svgText), never parsed as markup. The token comes from the URL's fragment, which the
// browser never sends; it goes on each API call as a header (no cookies).
// Capsules, runs and events come a page at a time (the newest first; "Older" buttons ask
// for more), and what the page keeps is bounded, so a long history stays quick to show.
"use strict";

(() => {
  const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
  const SVG = "http://www.w3.org/2000/svg";
  const state = {
    capsules: [], capsulesMore: false, capsulesTotal: 0, selected: null,
    runs: [], runsMore: false, runsTotal: 0, run: null, fresh: null,
    events: [], eventsMore: false, lastEvent: 0, armedDestroy: false,
  };
  // The events this page draws (the runs come from the runs API).
  const SHOWN = ["net.connection", "policy.report", "promotion", "witness", "replay", "file.changed",
    "deltamin.trial", "deltamin.done"];
  const CAPSULES_PAGE = 50, KEEP_RUNS = 1000, KEEP_EVENTS = 2000, PLOT_RUNS = 200, LIST_PATHS = 500;
  const $ = (id) => document.getElementById(id);
  // Bidi controls (overrides, isolates, marks) in a capsule's text would reorder what follows
  // them: a diff's line would read as other code than it is (Trojan Source), a file name as
  // another. They are shown as \u202e, as the CLI shows them; right-to-left letters stay.
  const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
  const shown = (text) => String(text).replace(BIDI, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = shown(text);
    if (cls) node.className = cls;
    return node;
  }

  function row(cells, cls) {
    const tr = el("tr", null, cls);
    for (const cell of cells) {
      const td = cell instanceof Node ? el("td") : el("td", cell);
      if (cell instanceof Node) td.append(cell);
      tr.append(td);
    }
    return tr;
  }

  async function api(path, body) {
    const init = { headers: { "X-CCW-Token": token }, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      init.method = "POST";
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch("/api/" + path, init);
    const data = await response.json().catch(() => ({ error: response.statusText }));
    if (!response.ok) throw new Error(data.error || String(response.status));
    return data;
  }

  const enc = encodeURIComponent;
  const duration = (ms) => (ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`);
  const status = (run) => (run.timed_out ? "timeout" : run.signal ? String(run.signal)
    : run.oom_killed && run.exit_code !== 0 ? "oom" : String(run.exit_code));
  const shellJoin = (argv) => argv.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`)).join(" ");

  // --- capsules ---------------------------------------------------------------
  // A reload asks again for as many as are shown (the server caps it); "older" continues
  // after the last one shown.
  async function loadCapsules(older) {
    const shown = state.capsules.length;
    const data = await api(older && shown ? `capsules?after=${enc(state.capsules[shown - 1].capsule_id)}`
      : `capsules?limit=${Math.max(shown, CAPSULES_PAGE)}`);
    // (A capsule destroyed meanwhile moves down the order: it is not listed twice.)
    const known = new Set(older ? state.capsules.map((c) => c.capsule_id) : []);
    state.capsules = older ? state.capsules.concat(data.capsules.filter((c) => !known.has(c.capsule_id))) : data.capsules;
    Object.assign(state, { capsulesMore: data.more, capsulesTotal: data.total });
    if (!state.lastEvent) state.lastEvent = data.last_event_id;
    renderCapsules();
    if (!state.selected && state.capsules.length) await select(state.capsules[0].capsule_id);
  }

  function renderCapsules() {
    const list = $("capsules");
    list.replaceChildren();
    for (const cap of state.capsules) {
      const li = el("li", cap.capsule_id, cap.destroyed_at ? "destroyed" : "");
      li.dataset.capsule = cap.capsule_id;
      if (cap.capsule_id === state.selected) li.classList.add("selected");
      li.append(el("span", cap.workspace, "sub"));
      li.append(el("span", `${cap.runs} runs${cap.egress ? " · egress" : ""}${cap.destroyed_at ? " · destroyed" : ""}`, "sub"));
      li.addEventListener("click", () => select(cap.capsule_id));
      list.append(li);
    }
    $("capsules-shown").textContent = `${state.capsules.length} of ${state.capsulesTotal}`;
    $("older-capsules").hidden = !state.capsulesMore;
  }

  // A forwarded port's link: the URL is built here from the port's number, never taken
  // from text a capsule could have shaped; services are shown as text.
  function showPorts(cap) {
    const box = $("cap-ports");
    box.replaceChildren();
    if (!cap || cap.destroyed_at) return;
    for (const p of cap.ports || []) {
      const port = Number(p.host_port);
      if (!Number.isInteger(port) || port < 1 || port > 65535) continue;
      const link = el("a", `port ${Number(p.port)} → 127.0.0.1:${port}`);
      link.href = `http://127.0.0.1:${port}/`;
      link.target = "_blank";
      link.rel = "noopener noreferrer";
      box.append(link, " ");
    }
    if ((cap.services || []).length) box.append(el("span", `services: ${cap.services.join(", ")}`, "sub"));
  }

  async function select(capsuleId) {
    Object.assign(state, { selected: capsuleId, runs: [], runsMore: false, runsTotal: 0, run: null, fresh: null,
      events: [], eventsMore: false, armedDestroy: false });
    for (const li of $("capsules").children) li.classList.toggle("selected", li.dataset.capsule === capsuleId);
    $("empty").hidden = true;
    $("capsule").hidden = false;
    $("run-detail").hidden = true;
    $("diff").replaceChildren();
    $("action-result").replaceChildren();
    $("destroy").textContent = "Destroy";
    const cap = state.capsules.find((c) => c.capsule_id === capsuleId);
    $("cap-title").textContent = capsuleId;
    $("cap-meta").textContent = cap ? shown(`${cap.workspace} · created ${cap.created_at}` +
      (cap.destroyed_at ? ` · destroyed ${cap.destroyed_at}` : "")) : "";
    showPorts(cap);
    await loadRuns(false);
    await loadEvents(false);
  }

  // --- runs ---------------------------------------------------------------------
  // The newest page, merged into what is shown (older pages loaded stay), or, with
  // ``older``, the page before the oldest shown.
  async function loadRuns(older) {
    const capsuleId = state.selected;
    const before = older && state.runs.length ? `?before=${state.runs[0].run}` : "";
    const data = await api(`capsules/${enc(capsuleId)}/runs${before}`);
    if (capsuleId !== state.selected) return;
    const newest = state.runs.length ? state.runs[state.runs.length - 1].run : 0;
    const gap = !older && data.runs.length && data.runs[0].run > newest + 1;  // more ran than a page since
    const byRun = new Map((gap ? [] : state.runs).map((r) => [r.run, r]));
    for (const run of data.runs) byRun.set(run.run, run);
    const runs = [...byRun.values()].sort((a, b) => a.run - b.run);
    if (older || gap || !state.runs.length) state.runsMore = data.more;
    if (runs.length > KEEP_RUNS) state.runsMore = true;
    Object.assign(state, { runs: runs.slice(-KEEP_RUNS), runsTotal: data.total });
    renderRuns();
  }

  // Runs finish faster than a page loads: one load at a time, and one more if asked meanwhile.
  let runsLoading = null, runsAgain = false;
  function refreshRuns(fresh) {
    state.fresh = fresh;
    if (runsLoading) { runsAgain = true; return; }
    runsLoading = (async () => {
      do { runsAgain = false; await loadRuns(false).catch((e) => setStatus(`cannot load runs: ${e.message}`)); }
      while (runsAgain);
      runsLoading = null;
    })();
  }

  function renderRuns() {
    const body = $("runs").tBodies[0];
    body.replaceChildren();
    for (const run of state.runs) {
      const code = status(run);
      const tr = row([run.run, shellJoin(run.argv), code, duration(run.duration_ms), run.reads ?? "-", run.writes,
        run.connections, run.generation_out === null ? `${run.generation ?? "-"}` : `${run.generation}>${run.generation_out}`],
      "run" + (state.fresh === run.run ? " fresh" : "") + (state.run === run.run ? " selected" : ""));
      tr.children[1].className = "argv";
      tr.children[2].className = code === "0" ? "ok" : "bad";
      tr.dataset.run = run.run;
      tr.addEventListener("click", () => showRun(run.run));
      body.append(tr);
    }
    const first = state.runs.length ? state.runs[0].run : 0;
    $("runs-shown").textContent = state.runs.length
      ? `runs ${first}–${state.runs[state.runs.length - 1].run} (${state.runs.length} shown of ${state.runsTotal})` : "";
    $("older-runs").hidden = !state.runsMore;
    plotUsage();
  }

  async function showRun(seq) {
    const detail = await api(`capsules/${enc(state.selected)}/runs/${seq}`);
    state.run = seq;
    for (const tr of $("runs").tBodies[0].children) tr.classList.toggle("selected", tr.dataset.run === String(seq));
    $("run-detail").hidden = false;
    $("run-title").textContent = shown(`run ${seq}: ${shellJoin(detail.argv)} — exit ${status(detail)}, ${duration(detail.duration_ms)}`);
    $("run-stdout").textContent = shown(detail.output.stdout ?? "(not kept)");
    $("run-stderr").textContent = shown(detail.output.stderr ?? "(not kept)");
    const written = tree(detail.written.slice(0, LIST_PATHS));
    if (detail.written_total > LIST_PATHS) written.push(el("li", `… and ${detail.written_total - LIST_PATHS} more ` +
      `(ccw capsule show ${state.selected} ${seq})`));
    $("run-written").replaceChildren(...written);
    $("run-read").replaceChildren(detail.read === null ? el("span", "not traced") : readList(detail.read, detail.read_total));
  }

  function readList(paths, total) {
    const box = el("details");
    box.append(el("summary", `${total} files`));
    const list = el("ul", null, "tree");
    list.append(...paths.slice(0, LIST_PATHS).map((path) => el("li", path)));
    if (total > LIST_PATHS) list.append(el("li", `… and ${total - LIST_PATHS} more (ccw capsule show --all)`));
    box.append(list);
    return box;
  }

  // Written paths as a tree of directories (each name is text, whatever it holds).
  function tree(paths) {
    const root = new Map();
    for (const path of paths) {
      let node = root;
      for (const part of path.split("/")) {
        if (!node.has(part)) node.set(part, new Map());
        node = node.get(part);
      }
    }
    const render = (node) => [...node.entries()].sort(([a], [b]) => (a < b ? -1 : 1)).map(([name, children]) => {
      const li = el("li", children.size ? name + "/" : name);
      li.dataset.path = name;
      if (children.size) li.append(el("ul")), li.lastChild.append(...render(children));
      return li;
    });
    return paths.length ? render(root) : [el("li", "(none)")];
  }

  // --- events -----------------------------------------------------------------------
  // The newest page of the capsule's events of the kinds drawn here, or the page before the
  // oldest kept; live ones are appended by the poll (``apply``).
  async function loadEvents(older) {
    const capsuleId = state.selected;
    const before = older && state.events.length ? `&before=${state.events[0].id}` : "";
    const data = await api(`events?capsule=${enc(capsuleId)}&kinds=${SHOWN.join(",")}${before}`);
    if (capsuleId !== state.selected) return;
    const byId = new Map(state.events.map((e) => [e.id, e]));
    for (const event of data.events) byId.set(event.id, event);
    state.events = [...byId.values()].sort((a, b) => a.id - b.id);
    state.eventsMore = data.more;
    keepEvents();
    renderEvents();
  }

  function keepEvents() {
    if (state.events.length <= KEEP_EVENTS) return;
    state.events = state.events.slice(-KEEP_EVENTS);
    state.eventsMore = true;
  }

  // A live event of the selected capsule; true when the events drawn changed (the poll
  // redraws them once per batch).
  function apply(event) {
    if (event.capsule_id !== state.selected) return false;
    const data = event.data, last = state.events[state.events.length - 1];
    if (SHOWN.includes(event.kind)) {
      if (last && last.id >= event.id) return false;  // the page already loaded it
      state.events.push(event);
      keepEvents();
      return true;
    } else if (event.kind === "run.started") {
      setStatus(`running in ${event.capsule_id}: ${data.label ?? ""}`);
      const pending = row(["…", data.label ?? "", "running", "", "", "", "", ""], "pending");
      pending.children[1].className = "argv";
      $("runs").tBodies[0].append(pending);
    }
    else if (event.kind === "run.failed") {  // started, then refused: no run, so its pending row goes
      setStatus(`${data.label ?? "a call"} failed: ${data.error ?? ""}`);
      refreshRuns(null);
    }
    else if (event.kind === "run.finished") {
      setStatus(`run ${data.seq} finished (exit ${data.exit_code})`);
      refreshRuns(data.seq);
    }
    return false;
  }

  function renderEvents() {
    const of = (...kinds) => state.events.filter((e) => kinds.includes(e.kind));
    // A running command's attempts come as each is decided (live, no run number, no bytes
    // yet); once it ends, its run's records (in the same commit as the run) take their place.
    const connections = of("net.connection");
    let lastFinal = -1;
    connections.forEach((e, i) => { if (!e.data.live) lastFinal = i; });
    const network = connections.filter((e, i) => !e.data.live || i > lastFinal).map((e) => e.data);
    const done = of("deltamin.done").map((e) => e.data);
    const body = $("network").tBodies[0];
    body.replaceChildren(...network.map((c) => {
      const tr = row([c.live ? "…" : c.seq, c.allowed ? "allowed" : "denied", c.host, c.port, c.protocol,
        c.rule ?? c.reason ?? "", c.live ? "" : `${c.bytes_in ?? 0} / ${c.bytes_out ?? 0}`], c.live ? "pending" : undefined);
      tr.children[1].className = c.allowed ? "ok" : "bad";
      tr.children[2].className = "host";
      return tr;
    }));
    $("reports").replaceChildren(...of("policy.report", "promotion", "witness", "replay", "file.changed").map(describe));
    $("deltamin").replaceChildren(...done.map((d) => el("li",
      `minimal: ${d.minimal} hunks${d.files === undefined ? "" : ` in ${d.files} files`} after ${d.trials} trials ` +
      `(${d.cache_hits} cached, ${duration(d.elapsed_ms ?? 0)})` +
      `, replay ${d.replay_ok ? "ok" : "failed"}${d.one_minimal ? ", 1-minimal" : ""}`)));
    plotTrials(of("deltamin.trial").map((e) => e.data));
    $("events-shown").textContent = state.events.length
      ? `network, reports, deltamin: ${state.events.length} events since ${state.events[0].at}` : "";
    $("older-events").hidden = !state.eventsMore;
  }

  function describe(event) {
    const d = event.data;
    if (event.kind === "promotion") {
      const onto = d.branch ? ` on branch ${d.branch.name}${d.branch.commit ? ` (${d.branch.commit.slice(0, 12)})` : ""}` : "";
      const text = d.refused ? `promotion refused — ${d.refused.code}: ${d.refused.message}`
        : d.branch ? `${d.dry_run ? "dry run: would commit" : "committed"} ${d.applied.length} files${onto}`
        : `${d.dry_run ? "dry run" : "promoted"}: ${d.applied.length} files`;
      return el("li", `${event.at} ${text}`, d.refused ? "bad" : "ok");
    }
    if (event.kind === "policy.report") {
      return el("li", `${event.at} policy report: ${d.passed ? "passed" : "failed"}` +
        (d.report && d.report.details ? ` — ${d.report.details}` : ""), d.passed ? "ok" : "bad");
    }
    if (event.kind === "file.changed") return el("li", `${event.at} file tool: ${d.action} ${d.path}`);
    if (event.kind === "witness") return el("li", `${event.at} witness ${d.witness_id} (${d.size_bytes} bytes)`);
    return el("li", `${event.at} replay: ${d.replay_ok ? "reproduced" : "differs"}, ${d.differences} outputs differ`,
      d.replay_ok ? "ok" : "bad");
  }

  async function poll() {
    for (;;) {
      try {
        setStatus(`live · event ${state.lastEvent}`);
        const data = await api(`events?after=${state.lastEvent}&wait=20000`);
        let capsulesChanged = false, questionsChanged = false, drawn = false;
        for (const event of data.events) {
          state.lastEvent = event.id;
          capsulesChanged ||= ["capsule.created", "capsule.destroyed", "run.finished"].includes(event.kind);
          questionsChanged ||= ["net.ask", "net.answer"].includes(event.kind);
          drawn = apply(event) || drawn;
        }
        if (drawn) renderEvents();
        if (data.events.length) document.dispatchEvent(new CustomEvent("ccw:events", { detail: data.events }));  // races.js
        if (questionsChanged) await loadQuestions();
        if (capsulesChanged) await loadCapsules();
      } catch (error) {
        setStatus(`disconnected (${error.message}); retrying`);
        await new Promise((resolve) => setTimeout(resolve, 2000));
      }
    }
  }

  function setStatus(text) { $("status").textContent = shown(text); }

  // --- questions: connections waiting for a person's answer (capsules/asks.py) ------
  // A question's fields came from a jail (host, command): shown as text, like the rest.
  async function loadQuestions() {
    const data = await api("questions");
    const body = $("question-list").tBodies[0];
    body.replaceChildren(...data.questions.map((q) => {
      const reason = el("input");
      reason.placeholder = "reason for the agent";
      reason.size = 20;
      const button = (label, answer) => {
        const b = el("button", label);
        b.type = "button";
        b.dataset.answer = answer;
        b.addEventListener("click", () => answerQuestion(q.id, answer, reason.value));
        return b;
      };
      const cell = el("span", null, "answers");
      // An agent's proposal (capsules/proposals.py) is about rules: approving adds them.
      const proposal = q.kind === "proposal";
      const allows = proposal ? [button("Approve", "capsule")]
        : [button("Allow once", "once"), button("Allow for this capsule", "capsule")];
      cell.append(...allows, reason, button("Deny", "denied"));
      const what = proposal ? `proposal of ${q.proposer}: ${q.rule}` : `${q.protocol} ${q.rule}`;
      const tr = row([q.capsule_id, what, q.command, q.expires_at, cell]);
      tr.dataset.question = q.id;
      tr.children[1].className = "host";
      tr.children[2].className = "argv";
      return tr;
    }));
    $("questions").hidden = data.questions.length === 0;
  }

  async function answerQuestion(id, answer, reason) {
    try {
      const done = await api(`questions/${id}`, answer === "denied" ? { answer, reason } : { answer });
      setStatus(`question ${id}: ${done.state}`);
    } catch (error) {
      setStatus(`question ${id}: ${error.message}`);
    }
    await loadQuestions().catch(() => {});
  }

  // --- plots (inline SVG, drawn here) ---------------------------------------------------
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = shown(text);
    return node;
  }

  function bars(title, runs, values, color) {
    const width = 260, height = 120, pad = 24;
    const chart = svg("svg", { width, height, role: "img", "aria-label": title });
    chart.append(svg("text", { x: pad, y: 14 }, title));
    const top = Math.max(1, ...values.map((v) => v ?? 0));
    const step = (width - 2 * pad) / Math.max(values.length, 1);
    values.forEach((value, i) => {
      const h = value === null || value === undefined ? 0 : ((height - 2 * pad) * value) / top;
      const bar = svg("rect", { x: pad + i * step + 1, y: height - pad - h, width: Math.max(step - 2, 1), height: h, fill: color });
      bar.append(svg("title", {}, `run ${runs[i].run}: ${value ?? "not measured"}`));
      chart.append(bar);
    });
    chart.append(svg("line", { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, stroke: "#8a8f99" }));
    const measured = values.some((v) => v !== null && v !== undefined);
    chart.append(svg("text", { x: pad, y: height - 6 }, measured ? `max ${Math.round(top)}` : "not measured"));
    return chart;
  }

  function plotUsage() {
    const runs = state.runs.slice(-PLOT_RUNS);
    $("usage-plot").replaceChildren(...(runs.length ? [
      bars("duration (ms) per run", runs, runs.map((r) => r.duration_ms), "#3366cc"),
      bars("CPU (ms) per run", runs, runs.map((r) => r.cpu_ms), "#d9822b"),
      memoryBars(runs),
    ] : []));
  }

  // The jail's peak is a memory cgroup's; without one (a rootless helper) only the largest
  // single process's peak is known, and the chart says which of the two it draws.
  function memoryBars(runs) {
    const whole = runs.some((r) => r.rss_max_kb !== null && r.rss_max_kb !== undefined);
    const kb = runs.map((r) => (whole ? r.rss_max_kb : r.rss_max_process_kb) ?? null);
    return bars(whole ? "max RSS (MiB) per run" : "largest process's max RSS (MiB) per run", runs,
      kb.map((v) => (v === null ? null : v / 1024)), "#1a7f37");
  }

  // deltamin's search: each trial's size (changes applied), coloured by its outcome.
  function plotTrials(trials) {
    if (!trials.length) { $("deltamin-plot").replaceChildren(); return; }
    const width = 520, height = 160, pad = 28;
    const chart = svg("svg", { width, height, role: "img", "aria-label": "deltamin trials" });
    chart.append(svg("text", { x: pad, y: 14 }, "deltamin: changes applied per trial (red: still fails)"));
    const top = Math.max(1, ...trials.map((t) => t.size));
    const step = (width - 2 * pad) / Math.max(trials.length - 1, 1);
    const colors = { fail: "#c62828", pass: "#1a7f37", unresolved: "#8a8f99" };  // core/deltamin.py's outcomes
    trials.forEach((trial, i) => {
      const dot = svg("circle", { cx: pad + i * step, cy: height - pad - ((height - 2 * pad) * trial.size) / top,
        r: 4, fill: colors[trial.outcome] || "#8a8f99" });
      dot.append(svg("title", {}, `trial ${i + 1}: ${trial.size} changes, ${trial.outcome}${trial.fresh ? " (confirmation)" : ""}`));
      chart.append(dot);
    });
    chart.append(svg("line", { x1: pad, y1: height - pad, x2: width - pad, y2: height - pad, stroke: "#8a8f99" }));
    $("deltamin-plot").replaceChildren(chart);
  }

  // --- actions: the same tools an agent calls -------------------------------------------
  function showOutcome(text, ok) {
    const box = $("action-result");
    box.textContent = shown(text);
    box.className = ok ? "done" : "refused";
  }

  async function promote(dryRun) {
    const policies = $("policies").value.split(",").map((p) => p.trim()).filter(Boolean);
    showOutcome(dryRun ? "checking…" : "promoting…", true);
    try {
      const answer = await api(`capsules/${enc(state.selected)}/promote`, { dry_run: dryRun, policies });
      if (!answer.ok) return showOutcome(`refused — ${answer.error.code}: ${answer.error.message}`, false);
      const result = answer.result, report = result.policy_report;
      if (result.promoted) return showOutcome(`promoted: ${result.applied.length} files written to the workspace`, true);
      if (result.dry_run && report.passed) return showOutcome(`dry run: the policies pass; would write ${result.applied.length} files`, true);
      const failed = Object.keys(report).filter((k) => k.endsWith("_ok") && report[k] === false).map((k) => k.slice(0, -3));
      const paths = report.deny_paths && report.deny_paths.length ? `; denied paths: ${report.deny_paths.join(", ")}` : "";
      showOutcome(`refused by the policies — failed: ${failed.join(", ") || "the policies"}${paths}` +
        (report.details ? `\n${report.details}` : ""), false);
    } catch (error) {
      showOutcome(`failed: ${error.message}`, false);
    }
  }

  async function destroy() {
    if (!state.armedDestroy) {
      state.armedDestroy = true;
      $("destroy").textContent = "Really destroy?";
      return;
    }
    state.armedDestroy = false;
    $("destroy").textContent = "Destroy";
    const answer = await api(`capsules/${enc(state.selected)}/destroy`, {}).catch((e) => ({ ok: false, error: { code: "", message: e.message } }));
    if (answer.ok) showOutcome("destroyed", true);
    else showOutcome(`refused — ${answer.error.code}: ${answer.error.message}`, false);
    await loadCapsules();
  }

  async function showDiff() {
    const pre = $("diff");
    pre.replaceChildren(el("span", "loading…"));
    const answer = await api(`capsules/${enc(state.selected)}/diff`).catch((e) => ({ ok: false, error: { code: "", message: e.message } }));
    if (!answer.ok) return pre.replaceChildren(el("span", `${answer.error.code}: ${answer.error.message}`, "del"));
    const s = answer.result.summary;
    const lines = [el("span", `${s.added} added, ${s.modified} modified, ${s.deleted} deleted\n`, "hunk")];
    for (const line of answer.result.diff.split("\n")) {
      const cls = /^(\+\+\+|---) /.test(line) ? "" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "";
      lines.push(el("span", line + "\n", cls));
    }
    pre.replaceChildren(...lines);
  }

  // What races.js (loaded after this file) uses of this one.
  window.ccwPage = Object.freeze({ api, el, row, duration, shellJoin, select, setStatus, shown });

  document.addEventListener("DOMContentLoaded", () => {
    $("promote").addEventListener("click", () => promote(false));
    $("dry-run").addEventListener("click", () => promote(true));
    $("destroy").addEventListener("click", destroy);
    $("show-diff").addEventListener("click", showDiff);
    const older = (load) => () => load(true).catch((error) => setStatus(`cannot load: ${error.message}`));
    $("older-capsules").addEventListener("click", older(loadCapsules));
    $("older-runs").addEventListener("click", older(loadRuns));
    $("older-events").addEventListener("click", older(loadEvents));
    if (!token) setStatus("no token: open the URL ccw ui printed");
    loadQuestions().catch(() => {});
    loadCapsules().then(poll, (error) => setStatus(`cannot load: ${error.message}`));
  });
})();
