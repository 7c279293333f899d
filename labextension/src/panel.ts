/**
 * The left-sidebar panel: the experiments under the configured roots, and one experiment's
 * trials, failures, chart and actions. It polls the server extension every 2 s while it is
 * visible and not at all while it (or the browser tab) is hidden.
 */

import { Clipboard, Notification } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { FtnbApi } from './api';
import { renderChart } from './chart';
import { h } from './dom';
import { copyableLine, deleteControl, progressFigure, statusBadge, trialRows } from './parts';
import {
  ChartData,
  EMPTY_CHART,
  ExperimentSummary,
  Snapshot,
  attachCellSource,
  failuresNewestFirst,
  formatAgo,
  matchesFilter,
  mergeSeries,
  silentDriver,
  silentDriverText,
  sortExperiments,
  statusCounts
} from './model';

/** How often a visible panel refreshes (ms). */
export const REFRESH_INTERVAL_MS = 2000;

/** What the panel needs from the application. */
export interface PanelHost {
  /** Insert a code cell below the active cell of the current notebook and run it; false when
   * no notebook is open. */
  runInNotebook(source: string): Promise<boolean>;
}

interface RootListing {
  root: string;
  experiments: ExperimentSummary[];
  error: string | null;
}

/** The ftnb panel of JupyterLab's left sidebar. */
export class ExperimentsPanel extends Widget {
  private listings: RootListing[] = [];
  private selected: string | null = null;
  private snapshot: Snapshot | null = null;
  private snapshotFetchedAt = 0;
  private chart: ChartData = EMPTY_CHART;
  private chartMetric: string | null = null;
  private logScale = false;
  private message: string | null = null;
  private renderedKey = '';
  private filter = '';
  /** The experiment whose Delete was clicked once: it asks before deleting. */
  private confirmingDelete: string | null = null;
  /** The server's refusal of the last delete, shown under the actions. */
  private deleteRefusal: string | null = null;
  private readonly filterBar: HTMLElement;
  private readonly openFailures = new Set<string>();
  private readonly poll: Poll;
  private readonly body: HTMLElement;

  constructor(
    private readonly api: FtnbApi,
    private readonly host: PanelHost
  ) {
    super();
    this.id = 'ftnb-experiments';
    this.addClass('ftnb-panel');
    this.node.dataset.testid = 'ftnb-lab-panel';
    this.title.caption = 'ftnb experiments';
    this.body = h('div', { class: 'ftnb-body' });
    // Kept across redraws (only the list under it is redrawn), so typing keeps its focus.
    this.filterBar = h(
      'div',
      { class: 'ftnb-filter' },
      h('input', {
        type: 'search',
        class: 'ftnb-filter-input',
        placeholder: 'Filter: name, path, status',
        'aria-label': 'Filter experiments by name, path or status',
        'data-testid': 'ftnb-lab-filter',
        oninput: (ev: Event) => {
          this.filter = (ev.target as HTMLInputElement).value;
          this.render();
        }
      })
    );
    this.node.append(this.filterBar, this.body);
    this.poll = new Poll({
      auto: false,
      factory: () => this.refresh(),
      frequency: { interval: REFRESH_INTERVAL_MS, backoff: false, max: REFRESH_INTERVAL_MS },
      // No request at all while the panel is collapsed or the tab is in the background.
      standby: () => !this.isVisible || 'when-hidden',
      name: 'ftnb:experiments-panel'
    });
    void this.poll.start();
    this.render();
  }

  /** The experiment shown, or null for the list. */
  get selectedPath(): string | null {
    return this.selected;
  }

  /** Show one experiment (null: back to the list). */
  select(path: string | null): void {
    this.selected = path;
    this.snapshot = null;
    this.chart = EMPTY_CHART;
    this.chartMetric = null;
    this.openFailures.clear();
    this.message = null;
    this.confirmingDelete = null;
    this.deleteRefusal = null;
    this.render();
    void this.poll.refresh();
  }

  dispose(): void {
    this.poll.dispose();
    super.dispose();
  }

  protected onAfterShow(): void {
    void this.poll.refresh();
  }

  private async refresh(): Promise<void> {
    try {
      if (this.selected === null) {
        await this.refreshList();
      } else {
        await this.refreshExperiment(this.selected);
      }
      this.message = null;
    } catch (error) {
      this.message = String((error as Error).message ?? error);
    }
    // Redrawn only when something changed, so a button or a select is not replaced under
    // the pointer every 2 s; the "ago" times are updated in place.
    const key = this.viewKey();
    if (key !== this.renderedKey) {
      this.render();
    } else {
      this.updateTimes();
    }
  }

  /** What the view shows: it is redrawn when this changes. */
  private viewKey(): string {
    return JSON.stringify([
      this.selected,
      this.message,
      this.logScale,
      this.selected === null ? this.listings : [this.snapshot, this.chart.rows, this.chart.metric]
    ]);
  }

  private updateTimes(): void {
    const now = Date.now();
    this.body.querySelectorAll<HTMLElement>('[data-ago]').forEach(el => {
      el.textContent = formatAgo(Number(el.dataset.ago), now);
    });
    const countdown = this.body.querySelector<HTMLElement>(
      '[data-testid=ftnb-lab-silent-driver] span'
    );
    const silent =
      this.snapshot && silentDriver(this.snapshot.experiment, this.snapshotFetchedAt, now);
    if (countdown && silent) {
      countdown.textContent = silentDriverText(silent);
    }
  }

  private async refreshList(): Promise<void> {
    const roots = await this.api.roots();
    this.listings = await Promise.all(
      roots.map(async root => {
        try {
          return { root, experiments: await this.api.experiments(root), error: null };
        } catch (error) {
          return { root, experiments: [], error: String((error as Error).message ?? error) };
        }
      })
    );
  }

  private async refreshExperiment(path: string): Promise<void> {
    const [snapshot, update] = await Promise.all([
      this.api.experiment(path),
      this.api.results(path, this.chartMetric, this.chart.rows)
    ]);
    if (this.selected !== path) {
      return; // the user went elsewhere while this was in flight
    }
    this.snapshot = snapshot;
    this.snapshotFetchedAt = Date.now();
    this.chart = mergeSeries(this.chart, update);
  }

  private async act(what: string, action: () => Promise<unknown>): Promise<void> {
    try {
      await action();
      Notification.success(what, { autoClose: 3000 });
    } catch (error) {
      Notification.error(`${what}: ${(error as Error).message ?? error}`, { autoClose: 8000 });
    }
    void this.poll.refresh();
  }

  // -- rendering ------------------------------------------------------------------------------

  private render(): void {
    this.renderedKey = this.viewKey();
    this.filterBar.hidden = this.selected !== null;
    const view = this.selected === null ? this.renderList() : this.renderExperiment();
    const message = this.message
      ? h('div', { class: 'ftnb-message', 'data-testid': 'ftnb-lab-message' }, this.message)
      : null;
    this.body.replaceChildren(...[message, view].filter((n): n is HTMLElement => n !== null));
  }

  private renderList(): HTMLElement {
    const now = Date.now();
    const filter = this.filter.trim();
    return h(
      'div',
      { class: 'ftnb-list', 'data-testid': 'ftnb-lab-list' },
      h('div', { class: 'ftnb-heading' }, h('h2', {}, 'ftnb experiments')),
      this.listings.map(listing => {
        const shown = listing.experiments.filter(e => matchesFilter(e, filter));
        return h(
          'section',
          { class: 'ftnb-root', 'data-root': listing.root },
          h('div', { class: 'ftnb-root-path', title: listing.root }, listing.root),
          listing.error && h('div', { class: 'ftnb-message' }, listing.error),
          !listing.error &&
            listing.experiments.length === 0 &&
            h('div', { class: 'ftnb-empty' }, 'No experiments here yet.'),
          filter &&
            listing.experiments.length > 0 &&
            h(
              'div',
              { class: 'ftnb-empty', 'data-testid': 'ftnb-lab-filter-count' },
              `${shown.length} of ${listing.experiments.length} match “${filter}”`
            ),
          sortExperiments(shown).map(e => this.renderSummary(e, now))
        );
      })
    );
  }

  private renderSummary(e: ExperimentSummary, now: number): HTMLElement {
    return h(
      'div',
      {
        class: 'ftnb-experiment',
        role: 'button',
        tabindex: 0,
        title: e.error ?? e.path,
        'data-testid': 'ftnb-lab-experiment',
        'data-name': e.name,
        'data-path': e.path,
        'data-status': e.status,
        onclick: () => this.select(e.path),
        onkeydown: (ev: KeyboardEvent) => ev.key === 'Enter' && this.select(e.path)
      },
      h(
        'div',
        { class: 'ftnb-experiment-line' },
        statusBadge(e.status),
        h('span', { class: 'ftnb-experiment-name' }, e.name),
        h(
          'span',
          { class: 'ftnb-ago', 'data-ago': e.last_activity },
          formatAgo(e.last_activity, now)
        )
      ),
      h(
        'div',
        { class: 'ftnb-experiment-line ftnb-dim' },
        statusCounts(e.trials).map(c =>
          h(
            'span',
            {
              class: `ftnb-count ftnb-status-${c.status}`,
              'data-testid': 'ftnb-lab-count',
              'data-status': c.status,
              'data-count': c.count
            },
            `${c.count} ${c.status.toLowerCase()}`
          )
        ),
        h(
          'span',
          {
            class: e.failures > 0 ? 'ftnb-failures ftnb-has-failures' : 'ftnb-failures',
            'data-testid': 'ftnb-lab-failures',
            'data-count': e.failures
          },
          `${e.failures} failure${e.failures === 1 ? '' : 's'}`
        )
      ),
      h('div', { class: 'ftnb-experiment-line' }, progressFigure(e))
    );
  }

  private renderExperiment(): HTMLElement {
    const back = h(
      'button',
      { class: 'ftnb-button ftnb-back', onclick: () => this.select(null) },
      '← experiments'
    );
    const s = this.snapshot;
    if (s === null) {
      return h(
        'div',
        { class: 'ftnb-detail' },
        back,
        h('div', { class: 'ftnb-empty' }, 'Loading…')
      );
    }
    const e = s.experiment;
    return h(
      'div',
      {
        class: 'ftnb-detail',
        'data-testid': 'ftnb-lab-detail',
        'data-path': e.path,
        'data-status': e.status
      },
      back,
      h('div', { class: 'ftnb-experiment-line' }, statusBadge(e.status), h('h2', {}, e.name)),
      h('div', { class: 'ftnb-path', title: e.path }, e.path),
      h(
        'div',
        { class: 'ftnb-experiment-line ftnb-dim' },
        statusCounts(e.counts).map(c =>
          h(
            'span',
            { class: `ftnb-count ftnb-status-${c.status}` },
            `${c.count} ${c.status.toLowerCase()}`
          )
        ),
        h('span', {}, `${e.total_failures} failure${e.total_failures === 1 ? '' : 's'}`)
      ),
      e.driver?.line && h('div', { class: 'ftnb-dim' }, e.driver.line),
      this.renderSilentDriver(s),
      this.renderActions(s),
      this.renderChartSection(s),
      this.renderTrials(s),
      this.renderFailures(s)
    );
  }

  private renderSilentDriver(s: Snapshot): HTMLElement | null {
    const silent = silentDriver(s.experiment, this.snapshotFetchedAt, Date.now());
    if (silent === null) {
      return null;
    }
    return h(
      'div',
      { class: 'ftnb-message', 'data-testid': 'ftnb-lab-silent-driver' },
      h('span', {}, silentDriverText(silent)),
      silent.takeover && h('div', {}, 'Take it over now: ', h('code', {}, silent.takeover))
    );
  }

  private renderActions(s: Snapshot): HTMLElement {
    const path = s.experiment.path;
    const actions = s.actions;
    const resume = actions?.resume;
    return h(
      'div',
      { class: 'ftnb-actions' },
      h(
        'button',
        {
          class: 'ftnb-button',
          'data-testid': 'ftnb-lab-stop',
          disabled: !actions?.stop,
          title: actions?.stop ? 'Stop the experiment (resumable)' : 'No live driver to stop',
          onclick: () => this.act(`Stop requested: ${s.experiment.name}`, () => this.api.stop(path))
        },
        'Stop'
      ),
      h(
        'button',
        {
          class: 'ftnb-button',
          'data-testid': 'ftnb-lab-resume',
          disabled: !resume?.available,
          title: resume?.available
            ? 'Resume in a new supervisor'
            : [resume?.reason, resume?.line && `Run: ${resume.line}`].filter(Boolean).join('\n'),
          onclick: () => this.act(`Resumed: ${s.experiment.name}`, () => this.api.resume(path))
        },
        'Resume'
      ),
      h(
        'button',
        {
          class: 'ftnb-button',
          'data-testid': 'ftnb-lab-open-widget',
          title: 'Insert and run a cell showing its live widget in the current notebook',
          onclick: async () => {
            if (!(await this.host.runInNotebook(attachCellSource(path)))) {
              Notification.warning('Open a notebook first: the widget goes into a new cell.', {
                autoClose: 5000
              });
            }
          }
        },
        'Open widget'
      ),
      h(
        'button',
        {
          class: 'ftnb-button',
          'data-testid': 'ftnb-lab-copy-path',
          title: path,
          onclick: () => {
            Clipboard.copyToSystem(path);
            Notification.info('Path copied', { autoClose: 2000 });
          }
        },
        'Copy path'
      ),
      s.experiment.storage_fault &&
        h(
          'div',
          { class: 'ftnb-error', 'data-testid': 'ftnb-lab-storage-fault' },
          s.experiment.storage_fault
        ),
      !resume?.available &&
        resume?.line &&
        copyableLine('Resume with: ', resume.line, 'ftnb-lab-resume-line'),
      this.renderDelete(s)
    );
  }

  /** Delete asks once (inline); the server refuses a live experiment, and its message is
   * shown under the button. */
  private renderDelete(s: Snapshot): HTMLElement {
    const { path, name } = s.experiment;
    return deleteControl({
      name,
      confirming: this.confirmingDelete === path,
      refusal: this.deleteRefusal,
      ask: () => {
        this.confirmingDelete = path;
        this.deleteRefusal = null;
        this.render();
      },
      cancel: () => {
        this.confirmingDelete = null;
        this.render();
      },
      confirm: () => void this.deleteExperiment(path, name)
    });
  }

  private async deleteExperiment(path: string, name: string): Promise<void> {
    this.confirmingDelete = null;
    try {
      await this.api.delete(path);
    } catch (error) {
      this.deleteRefusal = String((error as Error).message ?? error);
      this.render();
      return;
    }
    Notification.success(`Deleted: ${name}`, { autoClose: 3000 });
    // Gone from the list at once, not after the next poll.
    this.listings = this.listings.map(l => ({
      ...l,
      experiments: l.experiments.filter(e => e.path !== path)
    }));
    this.select(null);
  }

  private renderChartSection(s: Snapshot): HTMLElement {
    const metric = this.chart.metric ?? this.chartMetric;
    return h(
      'div',
      { class: 'ftnb-chart-section' },
      h(
        'div',
        { class: 'ftnb-experiment-line' },
        h('label', { class: 'ftnb-dim', for: 'ftnb-lab-metric-select' }, 'Metric'),
        h(
          'select',
          {
            id: 'ftnb-lab-metric-select',
            class: 'ftnb-select',
            'data-testid': 'ftnb-lab-metric',
            onchange: (ev: Event) => {
              this.chartMetric = (ev.target as HTMLSelectElement).value;
              this.chart = EMPTY_CHART;
              void this.poll.refresh();
            }
          },
          s.metrics.map(m => h('option', { value: m, selected: m === metric }, m))
        ),
        h(
          'label',
          { class: 'ftnb-dim' },
          h('input', {
            type: 'checkbox',
            'data-testid': 'ftnb-lab-log',
            checked: this.logScale,
            onchange: (ev: Event) => {
              this.logScale = (ev.target as HTMLInputElement).checked;
              this.render();
            }
          }),
          ' log'
        )
      ),
      renderChart(this.chart, this.logScale)
    );
  }

  private renderTrials(s: Snapshot): HTMLElement {
    const path = s.experiment.path;
    return trialRows(s.experiment.rows, {
      metric: this.chart.metric,
      stoppable: new Set(s.actions?.stop_trial ?? []),
      stopTrial: trialId =>
        void this.act(`Stop requested: trial ${trialId}`, () => this.api.stopTrial(path, trialId))
    });
  }

  private renderFailures(s: Snapshot): HTMLElement | null {
    const trials = failuresNewestFirst(s.failures ?? {});
    if (trials.length === 0) {
      return null;
    }
    return h(
      'div',
      { class: 'ftnb-failure-list', 'data-testid': 'ftnb-lab-failure-list' },
      h('h3', {}, 'Failures'),
      trials.flatMap(t =>
        t.failures.map(f => {
          const key = `${t.trial_id}/${f.attempt}`;
          const details = h(
            'details',
            {
              class: 'ftnb-failure',
              'data-trial-id': t.trial_id,
              open: this.openFailures.has(key)
            },
            h(
              'summary',
              {},
              h('code', {}, t.trial_id),
              ' ',
              f.summary,
              f.restart ? ` — ${f.restart}` : ''
            ),
            h('pre', { class: 'ftnb-traceback' }, f.traceback || f.message || '(no traceback)')
          );
          // Kept open across refreshes (the list is redrawn every 2 s).
          details.addEventListener('toggle', () =>
            details.open ? this.openFailures.add(key) : this.openFailures.delete(key)
          );
          return details;
        })
      )
    );
  }
}
