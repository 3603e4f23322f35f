// Races (capsule_race) on the ccw dashboard: the newest races, and one race's ranked table,
// as the state dir keeps them (mcp_server/capsules/races.py). A race's record changes as
// each capsule's row ends; each change is a "race" event, which app.js's poll passes on
// (a "ccw:events" event on document), so a running race's table fills up live.
// The command and a policy's details came in part from inside a capsule: set as text.
"use strict";

(() => {
  const { api, el, row, duration, shellJoin, select, setStatus, shown } = window.ccwPage;
  const LIST = 10;  // races listed; the table shows the chosen one (the newest at first)
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  let chosen = null, chosenByHand = false, loading = null, again = false;

  const SHORT = 100;  // characters of a command shown in the list and the title (all of it on hover)
  const short = (text) => (text.length > SHORT ? `${text.slice(0, SHORT - 1)}…` : text);
  const when = (iso) => (iso || "").replace("T", " ").replace(/\.\d+Z$/, "");
  const passed = (r) => !r.error && r.exit_code === 0 && !r.timed_out && r.verdict === "passed";
  const exitText = (r) => (r.timed_out ? "timeout" : String(r.exit_code));
  const stateText = (race) => (race.state === "running" ? `running, ${race.ended} of ${race.capsules} ended`
    : race.state);

  async function loadRaces() {
    const data = await api(`races?limit=${LIST}`);
    const body = $("race-list").tBodies[0];
    body.replaceChildren(...data.races.map((race) => {
      const best = race.best ? `${race.best.capsule_id}${passed(race.best) ? " (passed)" : ""}` : "—";
      const command = shellJoin(race.cmd);
      const tr = row([race.race_id, when(race.started_at), short(command), stateText(race), best], "run");
      tr.dataset.race = race.race_id;
      tr.children[2].className = "argv";
      tr.children[2].title = shown(command);
      tr.classList.toggle("selected", race.race_id === chosen);
      tr.addEventListener("click", () => { chosenByHand = true; showRace(race.race_id); });
      return tr;
    }));
    $("races-shown").textContent = data.more ? `the newest ${data.races.length}` : "";
    $("races").hidden = data.races.length === 0;
    // The newest race, unless the person chose one.
    const next = chosenByHand && chosen ? chosen : data.races.length ? data.races[0].race_id : null;
    if (next) await showRace(next);
  }

  function cells(r) {
    const capsule = el("a", r.capsule_id);
    capsule.href = "#";
    capsule.addEventListener("click", (event) => { event.preventDefault(); select(r.capsule_id); });
    if (r.error) return [String(r.rank), capsule, "—", "—", "—", "—", "—", "—", `${r.error.code}: ${r.error.message}`];
    const usage = r.usage || {};
    const policy = el("span", r.verdict, r.verdict === "passed" ? "ok" : "bad");
    policy.title = shown(r.verdict_details || "");
    return [String(r.rank), capsule, exitText(r), duration(r.duration_ms),
      usage.cpu_ms == null ? "—" : duration(usage.cpu_ms),
      usage.rss_max_kb == null ? "—" : `${(usage.rss_max_kb / 1024).toFixed(0)} MB`,
      r.diff ? String(r.diff.files) : "—", r.diff ? String(r.diff.lines) : "—", policy];
  }

  async function showRace(raceId) {
    const race = await api(`races/${enc(raceId)}`);
    chosen = raceId;
    for (const tr of $("race-list").tBodies[0].children) tr.classList.toggle("selected", tr.dataset.race === raceId);
    $("race-title").textContent = shown(`${race.race_id}: ${short(shellJoin(race.cmd))} · policy ${race.policy} · ` +
      `${race.capsules} capsules · ${stateText(race)}` + (race.elapsed_ms != null ? ` in ${duration(race.elapsed_ms)}` : "") +
      (race.owner ? ` · run by token ${race.owner}` : ""));
    const rows = race.rows.map((r) => {
      const tr = row(cells(r), passed(r) ? "" : "failed");
      tr.dataset.capsule = r.capsule_id;
      tr.children[2].className = r.error || r.exit_code !== 0 || r.timed_out ? "bad" : "ok";
      if (r.error) tr.children[8].className = "bad";
      return tr;
    });
    for (const capsuleId of race.pending) {
      const tr = row(["…", capsuleId, "running", "", "", "", "", "", ""], "pending");
      tr.dataset.capsule = capsuleId;
      rows.push(tr);
    }
    $("race-table").tBodies[0].replaceChildren(...rows);
    $("race-order").textContent = shown(race.error ? `ended by ${race.error.code}: ${race.error.message}`
      : race.order ? `ranked: ${race.order}; ${race.parallel} at once, ${race.executor}` : "");
  }

  // One load at a time, and one more if a race changed meanwhile.
  function refresh() {
    if (loading) { again = true; return; }
    loading = loadRaces().catch((error) => setStatus(`cannot load races: ${error.message}`)).finally(() => {
      loading = null;
      if (again) { again = false; refresh(); }
    });
  }

  document.addEventListener("ccw:events", (event) => {
    if (event.detail.some((e) => e.kind === "race")) refresh();
  });
  document.addEventListener("DOMContentLoaded", refresh);
})();
