import { describe, expect, it } from 'vitest';

import {
  EMPTY_CHART,
  ExperimentSummary,
  attachCellSource,
  chartLayout,
  experimentProgress,
  failuresNewestFirst,
  formatAgo,
  formatNumber,
  matchesFilter,
  mergeSeries,
  niceTicks,
  silentDriver,
  silentDriverText,
  sortExperiments,
  statusCounts,
  totalTrials
} from '../src/model';

function summary(name: string, status: string, last: number | null): ExperimentSummary {
  return {
    name,
    path: `/r/${name}`,
    status,
    trials: {},
    num_trials: 0,
    failures: 0,
    last_activity: last
  };
}

describe('statusCounts', () => {
  it('lists non-zero counts, known statuses in order, then others by name', () => {
    const counts = statusCounts({
      TERMINATED: 5,
      PENDING: 0,
      ERRORED: 1,
      RUNNING: 2,
      ZOMBIE: 1,
      ALIEN: 3
    });
    expect(counts).toEqual([
      { status: 'RUNNING', count: 2 },
      { status: 'TERMINATED', count: 5 },
      { status: 'ERRORED', count: 1 },
      { status: 'ALIEN', count: 3 },
      { status: 'ZOMBIE', count: 1 }
    ]);
  });

  it('is empty for an experiment with no trials', () => {
    expect(statusCounts({})).toEqual([]);
    expect(totalTrials({})).toBe(0);
  });

  it('totals the counts', () => {
    expect(totalTrials({ RUNNING: 2, TERMINATED: 5, ERRORED: 1 })).toBe(8);
  });
});

describe('sortExperiments', () => {
  it('puts running first, then interrupted, errored, finished, others; newest first', () => {
    const sorted = sortExperiments([
      summary('old-done', 'FINISHED', 100),
      summary('broken', 'UNREADABLE', null),
      summary('new-done', 'FINISHED', 300),
      summary('err', 'ERRORED', 50),
      summary('run', 'RUNNING', 10),
      summary('stopped', 'INTERRUPTED', 20)
    ]).map(e => e.name);
    expect(sorted).toEqual(['run', 'stopped', 'err', 'new-done', 'old-done', 'broken']);
  });

  it('breaks ties by name and does not change its argument', () => {
    const list = [summary('b', 'RUNNING', 5), summary('a', 'RUNNING', 5)];
    expect(sortExperiments(list).map(e => e.name)).toEqual(['a', 'b']);
    expect(list.map(e => e.name)).toEqual(['b', 'a']);
  });
});

describe('formatAgo', () => {
  const now = 1_000_000 * 1000;
  it('says seconds, minutes, hours, days', () => {
    expect(formatAgo(1_000_000 - 4, now)).toBe('4 s ago');
    expect(formatAgo(1_000_000 - 125, now)).toBe('2 min ago');
    expect(formatAgo(1_000_000 - 3 * 3600, now)).toBe('3 h ago');
    expect(formatAgo(1_000_000 - 2 * 86400 - 5, now)).toBe('2 d ago');
  });
  it("clamps a time in the future (another machine's clock) to 0 s", () => {
    expect(formatAgo(1_000_000 + 30, now)).toBe('0 s ago');
  });
  it('is empty without a time', () => {
    expect(formatAgo(null, now)).toBe('');
    expect(formatAgo(undefined, now)).toBe('');
  });
});

describe('silentDriver', () => {
  const experiment = (fields: object) =>
    ({
      name: 'x',
      path: '/r/x',
      status: 'RUNNING',
      counts: {},
      total_failures: 0,
      updated: null,
      metric_columns: [],
      param_columns: [],
      rows: [],
      ...fields
    }) as any;

  it('is null while the driver beats', () => {
    expect(silentDriver(experiment({ driver_silent_s: null }), 0, 5000)).toBeNull();
    expect(silentDriver(experiment({}), 0, 5000)).toBeNull();
  });

  it('counts down from the snapshot by the time since it was fetched', () => {
    const e = experiment({
      driver_silent_s: 25.3,
      driver_dead_in_s: 34.7,
      takeover: 'ftnb resume x --takeover'
    });
    expect(silentDriver(e, 1000, 1000)).toEqual({
      silentFor: 25,
      deadIn: 35,
      takeover: 'ftnb resume x --takeover'
    });
    const later = silentDriver(e, 1000, 11_000)!;
    expect([later.silentFor, later.deadIn]).toEqual([35, 25]);
    expect(silentDriverText(later)).toBe('Driver silent for 35 s: it counts as dead in 25 s.');
    const past = silentDriver(e, 1000, 100_000)!;
    expect(past.deadIn).toBe(0);
    expect(silentDriverText(past)).toBe('Driver silent for 124 s: it counts as dead now.');
  });

  it('says when the driver never counts as dead on its own', () => {
    const d = silentDriver(experiment({ driver_silent_s: 12, driver_dead_in_s: null }), 0, 0)!;
    expect(d.deadIn).toBeNull();
    expect(silentDriverText(d)).toBe(
      'Driver silent for 12 s: it will not count as dead on its own.'
    );
  });
});

describe('failuresNewestFirst', () => {
  it("orders trials by their newest failure, and each trial's failures newest first", () => {
    const f = (attempt: number, time: number) => ({
      attempt,
      time,
      iteration: 1,
      kind: 'exception',
      summary: `attempt ${attempt}`
    });
    const ordered = failuresNewestFirst({
      t0: [f(1, 10), f(2, 30)],
      t1: [f(1, 50)],
      t2: []
    });
    expect(ordered.map(t => t.trial_id)).toEqual(['t1', 't0']);
    expect(ordered[1].failures.map(x => x.attempt)).toEqual([2, 1]);
  });
});

describe('mergeSeries', () => {
  const first = {
    metric: 'loss',
    series: {
      a: { label: 'lr=0.1', x: [1, 2], y: [0.5, 0.4], rows: 2 },
      b: { label: 'lr=0.01', x: [1], y: [0.9], rows: 1 }
    }
  };

  it('appends new rows and records the rows seen (the next since)', () => {
    const one = mergeSeries(EMPTY_CHART, first);
    const two = mergeSeries(one, {
      metric: 'loss',
      series: { a: { label: 'lr=0.1', x: [3], y: [0.3], rows: 3 } }
    });
    expect(two.series.a).toEqual({ label: 'lr=0.1', x: [1, 2, 3], y: [0.5, 0.4, 0.3] });
    expect(two.series.b.x).toEqual([1]);
    expect(two.rows).toEqual({ a: 3, b: 1 });
    // the earlier state is untouched
    expect(one.series.a.x).toEqual([1, 2]);
    expect(one.rows).toEqual({ a: 2, b: 1 });
  });

  it('starts a trial over when its rows were replaced (reset)', () => {
    const one = mergeSeries(EMPTY_CHART, first);
    const two = mergeSeries(one, {
      metric: 'loss',
      series: { a: { label: 'lr=0.1', x: [1, 2, 3], y: [0.6, 0.5, 0.2], rows: 3, reset: true } }
    });
    expect(two.series.a.x).toEqual([1, 2, 3]);
    expect(two.series.a.y).toEqual([0.6, 0.5, 0.2]);
  });

  it('drops everything when the metric changes', () => {
    const one = mergeSeries(EMPTY_CHART, first);
    const two = mergeSeries(one, {
      metric: 'acc',
      series: { b: { label: 'lr=0.01', x: [1], y: [0.7], rows: 1 } }
    });
    expect(Object.keys(two.series)).toEqual(['b']);
    expect(two.rows).toEqual({ b: 1 });
    expect(two.metric).toBe('acc');
  });
});

describe('chartLayout', () => {
  const opts = { width: 200, height: 100, margin: { left: 0, right: 0, top: 0, bottom: 0 } };

  it('scales every trial into the plot area, one line each', () => {
    const layout = chartLayout(
      {
        a: { label: 'a', x: [0, 10], y: [0, 10] },
        b: { label: 'b', x: [0, 10], y: [10, 0] }
      },
      opts
    );
    expect(layout.lines.map(l => l.d)).toEqual(['M0 100 L200 0', 'M0 0 L200 100']);
    expect(layout.lines.map(l => l.color)).toEqual([0, 1]);
  });

  it('breaks a line at a missing value instead of dropping to zero', () => {
    const layout = chartLayout({ a: { label: 'a', x: [0, 1, 2, 3], y: [1, null, 2, 3] } }, opts);
    expect(layout.lines[0].d.match(/M/g)?.length).toBe(2);
    expect(layout.lines[0].points).toBe(3);
  });

  it('plots log10 on a log scale and counts the values it cannot show', () => {
    const layout = chartLayout(
      { a: { label: 'a', x: [0, 1, 2, 3], y: [0, 1, 10, 100] } },
      { ...opts, log: true }
    );
    expect(layout.hidden).toBe(1);
    // the x range is that of the values shown
    expect(layout.lines[0].d).toBe('M0 100 L100 50 L200 0');
    expect(layout.yTicks.map(t => t.value)).toEqual([1, 10, 100]);
  });

  it('draws a single point and an empty chart without dividing by zero', () => {
    const one = chartLayout({ a: { label: 'a', x: [5], y: [2] } }, opts);
    expect(one.lines[0].d).toMatch(/^M0 100$/);
    const none = chartLayout({}, opts);
    expect(none.lines).toEqual([]);
    expect(none.xTicks).toEqual([]);
  });
});

describe('niceTicks and formatNumber', () => {
  it('gives round steps', () => {
    expect(niceTicks(0, 10)).toEqual([0, 5, 10]);
    expect(niceTicks(0.1, 0.9)).toEqual([0.2, 0.4, 0.6, 0.8]);
    expect(niceTicks(3, 3)).toEqual([3]);
  });
  it('writes numbers short', () => {
    expect(formatNumber(12)).toBe('12');
    expect(formatNumber(0.123456)).toBe('0.1235');
    expect(formatNumber(0.00001234)).toBe('1.23e-5');
    expect(formatNumber(null)).toBe('');
    expect(formatNumber('x')).toBe('x');
  });
});

describe('attachCellSource', () => {
  it('quotes any path as a Python string literal', () => {
    expect(attachCellSource('/r/a "b"\\c\nd')).toBe(
      'import ftnb\nftnb.attach("/r/a \\"b\\"\\\\c\\nd").display()'
    );
  });
});

describe('experimentProgress', () => {
  it('counts ended trials (terminated or errored) out of all of them', () => {
    const e = {
      ...summary('a', 'RUNNING', 1),
      trials: { RUNNING: 2, PENDING: 3, TERMINATED: 2, ERRORED: 1 },
      num_trials: 8
    };
    expect(experimentProgress(e)).toEqual({ done: 3, total: 8, text: '3/8 done' });
  });

  it('takes the counts when num_trials is behind, and reads an empty experiment as 0/0', () => {
    const e = { ...summary('a', 'RUNNING', 1), trials: { TERMINATED: 4 }, num_trials: 2 };
    expect(experimentProgress(e).text).toBe('4/4 done');
    expect(experimentProgress(summary('b', 'FINISHED', 1)).text).toBe('0/0 done');
  });
});

describe('matchesFilter', () => {
  const e = { ...summary('lr_sweep', 'INTERRUPTED', 1), path: '/data/results/lr_sweep' };

  it('matches every word in the name, the path or the status, case ignored', () => {
    expect(matchesFilter(e, '')).toBe(true);
    expect(matchesFilter(e, 'SWEEP')).toBe(true);
    expect(matchesFilter(e, 'data interrupted')).toBe(true);
    expect(matchesFilter(e, 'sweep running')).toBe(false);
  });

  it('takes status:X as that exact status', () => {
    expect(matchesFilter(e, 'status:interrupted')).toBe(true);
    expect(matchesFilter(e, 'status:inter')).toBe(false);
  });
});
