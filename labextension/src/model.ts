/**
 * The panel's model: how the server extension's JSON becomes what the panel shows. Pure
 * functions over plain data (no DOM, no JupyterLab), so they are unit-tested on their own
 * (test/model.test.ts).
 */

/** Trial statuses in the order the panel lists their counts. */
export const TRIAL_STATUSES = ['RUNNING', 'PENDING', 'PAUSED', 'TERMINATED', 'ERRORED'] as const;

/** One experiment of `GET ftnb/api/experiments`. */
export interface ExperimentSummary {
  path: string;
  name: string;
  status: string;
  trials: Record<string, number>;
  num_trials: number;
  failures: number;
  last_activity: number | null;
  preemptions?: number;
  created?: number | null;
  /** A live driver owns it: stops act now. */
  live?: boolean;
  driver?: DriverInfo | null;
  resume_line?: string | null;
  error?: string | null;
}

/** What the read model says about an experiment's driver (the supervisor or script). */
export interface DriverInfo {
  pid?: number | null;
  host?: string | null;
  alive?: boolean | null;
  gone?: boolean | null;
  why?: string | null;
  line?: string | null;
}

/** One trial row of a snapshot's `experiment.rows`. */
export interface TrialRow {
  trial_id: string;
  status: string;
  iteration: number | null;
  attempts: number;
  failures: number;
  last_error: string | null;
  metrics: Record<string, unknown>;
  params: Record<string, unknown>;
  num_workers?: number;
  error_reason?: string | null;
  /** The status as views show it: STOPPED for a trial a user stopped before it completed. */
  shown_status?: string;
}

/** One failure of a snapshot's `failures`. */
export interface FailureInfo {
  attempt: number;
  time: number | null;
  iteration: number | null;
  kind: string;
  type?: string | null;
  message?: string | null;
  traceback?: string | null;
  summary: string;
  restart?: string | null;
}

/** The read model's snapshot (`GET ftnb/api/experiment`), the parts the panel uses. */
export interface Snapshot {
  experiment: {
    name: string;
    path: string;
    status: string;
    counts: Record<string, number>;
    total_failures: number;
    updated: number | null;
    metric_columns: string[];
    param_columns: string[];
    rows: TrialRow[];
    driver?: DriverInfo | null;
    resume_line?: string | null;
    /** Why it stopped when its storage refused a write (the path, the error and the fix). */
    storage_fault?: string | null;
    /** While its driver is silent (no heartbeat, death unproven), else null: */
    driver_silent_s?: number | null;
    driver_dead_in_s?: number | null;
    takeover?: string | null;
  };
  metrics: string[];
  failures: Record<string, FailureInfo[]>;
  actions?: Actions;
  root?: string;
}

/** What the panel's buttons can do now (a snapshot's `actions`). */
export interface Actions {
  stop: boolean;
  stop_trial: string[];
  resume: { available: boolean; reason?: string | null; line?: string | null };
}

/** One trial's curve of `GET ftnb/api/results`. */
export interface Series {
  label: string;
  x: number[];
  y: (number | null)[];
}

/** One trial's new rows in `GET ftnb/api/results`. */
export interface SeriesUpdate extends Series {
  /** Rows read so far: the next request's `since` for this trial. */
  rows: number;
  /** Its rows were replaced (it restarted from a checkpoint): x/y start from row 0. */
  reset?: boolean;
}

/** `GET ftnb/api/results`: a metric's rows per trial after those already seen. */
export interface ResultsUpdate {
  metric: string;
  metrics?: string[];
  series: Record<string, SeriesUpdate>;
}

/** A count of trials in one status, for the list's badges. */
export interface StatusCount {
  status: string;
  count: number;
}

/**
 * The non-zero trial counts in the panel's order: the known statuses first
 * (TRIAL_STATUSES), then any other status by name, so a status added on the server still shows.
 */
export function statusCounts(trials: Record<string, number>): StatusCount[] {
  const known = TRIAL_STATUSES.filter(s => (trials[s] ?? 0) > 0).map(s => ({
    status: s,
    count: trials[s]
  }));
  const others = Object.keys(trials)
    .filter(s => !(TRIAL_STATUSES as readonly string[]).includes(s) && trials[s] > 0)
    .sort()
    .map(s => ({ status: s, count: trials[s] }));
  return [...known, ...others];
}

/** Sum of the counts: the trials the counts cover. */
export function totalTrials(trials: Record<string, number>): number {
  return Object.values(trials).reduce((a, b) => a + (b > 0 ? b : 0), 0);
}

/** How far an experiment is: its trials that ended (TERMINATED or ERRORED: they will not
 * run again unless it is resumed) out of all its trials. */
export interface Progress {
  done: number;
  total: number;
  /** "3/8 done". */
  text: string;
}

const ENDED_TRIAL_STATUSES = ['TERMINATED', 'ERRORED'];

/** The progress figure of a listed experiment. */
export function experimentProgress(e: ExperimentSummary): Progress {
  const counted = totalTrials(e.trials ?? {});
  const total = Math.max(e.num_trials ?? 0, counted);
  const done = ENDED_TRIAL_STATUSES.reduce((sum, s) => sum + Math.max(e.trials?.[s] ?? 0, 0), 0);
  return { done, total, text: `${done}/${total} done` };
}

/**
 * Whether an experiment matches the panel's filter: every word of `query` (case ignored)
 * appears in its name, its path or its status, or is `status:X` / a bare status word such as
 * "running" matching its status. An empty query matches everything.
 */
export function matchesFilter(e: ExperimentSummary, query: string): boolean {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  const status = e.status.toLowerCase();
  const haystack = `${e.name}\n${e.path}\n${status}`.toLowerCase();
  return words.every(word =>
    word.startsWith('status:') ? status === word.slice(7) : haystack.includes(word)
  );
}

// A running experiment first (it is what one watches), then one that needs a decision
// (interrupted: resumable; errored), then finished ones.
const EXPERIMENT_RANK: Record<string, number> = {
  RUNNING: 0,
  INTERRUPTED: 1,
  ERRORED: 2,
  FINISHED: 3
};

/**
 * The experiments in the order the panel lists them: by status (running, interrupted,
 * errored, finished, anything else), then the most recently active first, then by name.
 * Returns a new array.
 */
export function sortExperiments(experiments: ExperimentSummary[]): ExperimentSummary[] {
  const rank = (e: ExperimentSummary) => EXPERIMENT_RANK[e.status] ?? 4;
  return [...experiments].sort(
    (a, b) =>
      rank(a) - rank(b) ||
      (b.last_activity ?? -Infinity) - (a.last_activity ?? -Infinity) ||
      a.name.localeCompare(b.name)
  );
}

/** How long ago a Unix time was, in a few characters: "4 s ago", "12 min ago", "3 d ago". */
export function formatAgo(unixSeconds: number | null | undefined, nowMs: number): string {
  if (unixSeconds === null || unixSeconds === undefined || !isFinite(unixSeconds)) {
    return '';
  }
  const s = Math.max(0, Math.round(nowMs / 1000 - unixSeconds));
  if (s < 60) {
    return `${s} s ago`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ago`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)} h ago`;
  }
  return `${Math.floor(s / 86400)} d ago`;
}

/** A silent driver as the panel counts it down between two snapshots. */
export interface SilentDriver {
  /** Seconds since its last heartbeat. */
  silentFor: number;
  /** Seconds until it counts as dead (the experiment INTERRUPTED), or null: never on its own. */
  deadIn: number | null;
  /** The line that takes the experiment over now. */
  takeover: string | null;
}

/**
 * The snapshot's silent driver (null when its driver is not silent), aged by the time since
 * the snapshot was fetched, so the countdown moves between two refreshes.
 */
export function silentDriver(
  experiment: Snapshot['experiment'],
  fetchedAtMs: number,
  nowMs: number
): SilentDriver | null {
  const silent = experiment.driver_silent_s;
  if (typeof silent !== 'number') {
    return null;
  }
  const aged = Math.max(0, (nowMs - fetchedAtMs) / 1000);
  const deadIn = experiment.driver_dead_in_s;
  return {
    silentFor: Math.round(silent + aged),
    deadIn: typeof deadIn === 'number' ? Math.max(0, Math.round(deadIn - aged)) : null,
    takeover: experiment.takeover ?? null
  };
}

/** What the panel says about a silent driver, in one line. */
export function silentDriverText(d: SilentDriver): string {
  const dead =
    d.deadIn === null
      ? 'it will not count as dead on its own'
      : d.deadIn > 0
        ? `it counts as dead in ${d.deadIn} s`
        : 'it counts as dead now';
  return `Driver silent for ${d.silentFor} s: ${dead}.`;
}

/** The trials that failed, newest failure first, each with its failures newest first. */
export function failuresNewestFirst(
  failures: Record<string, FailureInfo[]>
): { trial_id: string; failures: FailureInfo[] }[] {
  const newest = (list: FailureInfo[]) =>
    list.reduce((t, f) => Math.max(t, f.time ?? -Infinity), -Infinity);
  return Object.entries(failures)
    .filter(([, list]) => list.length > 0)
    .map(([trial_id, list]) => ({
      trial_id,
      failures: [...list].sort((a, b) => (b.time ?? 0) - (a.time ?? 0) || b.attempt - a.attempt)
    }))
    .sort(
      (a, b) => newest(b.failures) - newest(a.failures) || a.trial_id.localeCompare(b.trial_id)
    );
}

// -- the chart --------------------------------------------------------------------------------

/** A metric's curves as the panel holds them: every row received so far, per trial. */
export type SeriesByTrial = Record<string, Series>;

/** The chart's data: one metric's curves and the rows read per trial (the next `since`). */
export interface ChartData {
  metric: string | null;
  series: SeriesByTrial;
  rows: Record<string, number>;
}

/** No data yet: the first request asks for everything. */
export const EMPTY_CHART: ChartData = { metric: null, series: {}, rows: {} };

/**
 * `current` with an update's rows appended (the server sends only rows after `since`); a
 * trial marked `reset` starts over, and an update for another metric replaces everything.
 * Returns a new object; `current` is unchanged.
 */
export function mergeSeries(current: ChartData, update: ResultsUpdate): ChartData {
  const same = update.metric === current.metric;
  const series: SeriesByTrial = {};
  const rows: Record<string, number> = same ? { ...current.rows } : {};
  if (same) {
    for (const [id, s] of Object.entries(current.series)) {
      series[id] = { label: s.label, x: [...s.x], y: [...s.y] };
    }
  }
  for (const [id, s] of Object.entries(update.series)) {
    const held = series[id];
    if (held === undefined || s.reset) {
      series[id] = { label: s.label, x: [...s.x], y: [...s.y] };
    } else {
      held.label = s.label || held.label;
      held.x.push(...s.x);
      held.y.push(...s.y);
    }
    rows[id] = s.rows;
  }
  return { metric: update.metric, series, rows };
}

/** One drawn line of the chart. */
export interface ChartLine {
  trial_id: string;
  label: string;
  /** An SVG path: `M x y L x y ...`, a new `M` after a gap (a missing or unplottable value). */
  d: string;
  /** Its index in the theme's categorical palette. */
  color: number;
  points: number;
}

/** The chart's geometry, in SVG user units. */
export interface ChartLayout {
  width: number;
  height: number;
  lines: ChartLine[];
  xTicks: { value: number; pos: number }[];
  yTicks: { value: number; pos: number }[];
  /** Values left out because the log scale cannot show them (zero or negative). */
  hidden: number;
}

export interface ChartOptions {
  width: number;
  height: number;
  log?: boolean;
  margin?: { left: number; right: number; top: number; bottom: number };
}

/** Evenly spaced round tick values covering [lo, hi] (at most about `count`). */
export function niceTicks(lo: number, hi: number, count = 4): number[] {
  if (!isFinite(lo) || !isFinite(hi)) {
    return [];
  }
  if (lo === hi) {
    return [lo];
  }
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) ?? 10 * mag;
  const ticks: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

/**
 * Where each trial's line goes: x is the training iteration, y the metric (its log10 with
 * `log`), both scaled to the plot area; non-finite values, and values <= 0 on a log scale,
 * break the line instead of bending it to zero.
 */
export function chartLayout(series: SeriesByTrial, options: ChartOptions): ChartLayout {
  const { width, height, log = false } = options;
  const m = options.margin ?? { left: 44, right: 8, top: 8, bottom: 20 };
  let hidden = 0;
  const points: Record<string, ([number, number] | null)[]> = {};
  let xMin = Infinity;
  let xMax = -Infinity;
  let yMin = Infinity;
  let yMax = -Infinity;
  const ids = Object.keys(series).sort();
  for (const id of ids) {
    const s = series[id];
    points[id] = s.x.map((x, i) => {
      const raw = s.y[i];
      if (typeof raw !== 'number' || !isFinite(raw) || !isFinite(x)) {
        return null;
      }
      if (log && raw <= 0) {
        hidden += 1;
        return null;
      }
      const y = log ? Math.log10(raw) : raw;
      xMin = Math.min(xMin, x);
      xMax = Math.max(xMax, x);
      yMin = Math.min(yMin, y);
      yMax = Math.max(yMax, y);
      return [x, y];
    });
  }
  const plotW = width - m.left - m.right;
  const plotH = height - m.top - m.bottom;
  const xSpan = xMax > xMin ? xMax - xMin : 1;
  const ySpan = yMax > yMin ? yMax - yMin : 1;
  const px = (x: number) => m.left + ((x - xMin) / xSpan) * plotW;
  const py = (y: number) => m.top + plotH - ((y - yMin) / ySpan) * plotH;
  const round = (v: number) => Math.round(v * 10) / 10;
  const lines: ChartLine[] = ids.map((id, color) => {
    let d = '';
    let pen = false;
    let count = 0;
    for (const p of points[id]) {
      if (p === null) {
        pen = false;
        continue;
      }
      d += `${pen ? 'L' : 'M'}${round(px(p[0]))} ${round(py(p[1]))} `;
      pen = true;
      count += 1;
    }
    return { trial_id: id, label: series[id].label, d: d.trim(), color, points: count };
  });
  const xTicks =
    xMin <= xMax ? niceTicks(xMin, xMax).map(value => ({ value, pos: round(px(value)) })) : [];
  const yTicks =
    yMin <= yMax
      ? (log
          ? niceTicks(Math.floor(yMin), Math.ceil(yMax)).filter(Number.isInteger)
          : niceTicks(yMin, yMax)
        )
          .filter(v => v >= yMin - 1e-12 && v <= yMax + 1e-12)
          .map(v => ({ value: log ? Math.pow(10, v) : v, pos: round(py(v)) }))
      : [];
  return { width, height, lines, xTicks, yTicks, hidden };
}

/** A number for an axis or a table: short, exact for integers. */
export function formatNumber(value: unknown): string {
  if (typeof value !== 'number') {
    return value === null || value === undefined ? '' : String(value);
  }
  if (!isFinite(value)) {
    return String(value);
  }
  if (Number.isInteger(value) && Math.abs(value) < 1e6) {
    return String(value);
  }
  const a = Math.abs(value);
  return a !== 0 && (a < 1e-3 || a >= 1e6)
    ? value.toExponential(2)
    : String(Number(value.toPrecision(4)));
}

/**
 * The code cell that shows an experiment's live widget in a notebook. The path goes in as a
 * JSON string, which is also a valid Python string literal (quotes, backslashes, newlines
 * escaped).
 */
export function attachCellSource(path: string): string {
  return `import ftnb\nftnb.attach(${JSON.stringify(path)}).display()`;
}
