/**
 * Parts of the panel's views that fit its narrow default width (250 px): the trials as stacked
 * rows (never a wide table behind a horizontal scroll), a line to run with its copy button,
 * status badges and the progress figure.
 */

import { Clipboard, Notification } from '@jupyterlab/apputils';

import { h } from './dom';
import { ExperimentSummary, TrialRow, experimentProgress, formatNumber } from './model';

/** A status as a badge: the status's color is its border, the text is the theme's own. */
export function statusBadge(status: string): HTMLElement {
  return h('span', { class: `ftnb-status ftnb-status-${status}`, 'data-status': status }, status);
}

/** A trial's params in one line: `lr=0.01, bs=32`. */
export function paramsText(params: Record<string, unknown>): string {
  return Object.entries(params ?? {})
    .map(([k, v]) => `${k}=${typeof v === 'number' ? formatNumber(v) : JSON.stringify(v)}`)
    .join(', ');
}

/** A line to run (`%ftresume ...`), wrapped wherever it must be, with a button copying it. */
export function copyableLine(label: string, line: string, testid: string): HTMLElement {
  return h(
    'div',
    { class: 'ftnb-dim ftnb-resume-line', 'data-testid': testid },
    label,
    h('code', {}, line),
    h(
      'button',
      {
        class: 'ftnb-button ftnb-small',
        title: `Copy: ${line}`,
        'aria-label': `Copy ${line}`,
        onclick: () => {
          Clipboard.copyToSystem(line);
          Notification.info('Copied', { autoClose: 2000 });
        }
      },
      'Copy'
    )
  );
}

/** How far a listed experiment is: "3/8 done" and a bar. */
export function progressFigure(e: ExperimentSummary): HTMLElement {
  const p = experimentProgress(e);
  const percent = p.total > 0 ? Math.round((100 * p.done) / p.total) : 0;
  return h(
    'span',
    {
      class: 'ftnb-progress',
      'data-testid': 'ftnb-lab-progress',
      'data-done': p.done,
      'data-total': p.total
    },
    h(
      'span',
      {
        class: 'ftnb-progress-bar',
        role: 'progressbar',
        'aria-label': `${e.name}: trials done`,
        'aria-valuemin': 0,
        'aria-valuemax': p.total,
        'aria-valuenow': p.done
      },
      h('span', { class: 'ftnb-progress-fill', style: `width: ${percent}%` })
    ),
    p.text
  );
}

/** What a trial row needs from the panel. */
export interface TrialRowsOptions {
  metric: string | null;
  /** Trials a stop acts on now. */
  stoppable: Set<string>;
  stopTrial(trialId: string): void;
}

/**
 * The trials as stacked rows: id, status and Stop on the first line; iteration, failures and
 * the metric on the second; the params, wrapped, on the third. Everything stays inside the
 * panel's width, however narrow.
 */
export function trialRows(rows: TrialRow[], options: TrialRowsOptions): HTMLElement {
  const { metric, stoppable } = options;
  const row = (t: TrialRow) => {
    const params = paramsText(t.params);
    return h(
      'li',
      {
        class: 'ftnb-trial',
        'data-testid': 'ftnb-lab-trial',
        'data-trial-id': t.trial_id,
        'data-status': t.status
      },
      h(
        'div',
        { class: 'ftnb-trial-head' },
        h('code', { class: 'ftnb-trial-id', title: t.trial_id }, t.trial_id),
        statusBadge(t.shown_status || t.status),
        stoppable.has(t.trial_id) &&
          h(
            'button',
            {
              class: 'ftnb-button ftnb-small',
              'data-testid': 'ftnb-lab-stop-trial',
              'data-trial-id': t.trial_id,
              title: `Stop trial ${t.trial_id} (the others go on)`,
              'aria-label': `Stop trial ${t.trial_id}`,
              onclick: () => options.stopTrial(t.trial_id)
            },
            'Stop'
          )
      ),
      h(
        'div',
        { class: 'ftnb-trial-facts' },
        h('span', {}, `iter ${formatNumber(t.iteration)}`),
        h('span', {}, `${formatNumber(t.failures)} fail`),
        metric &&
          h(
            'span',
            { class: 'ftnb-trial-metric', 'data-testid': 'ftnb-lab-trial-metric' },
            `${metric} ${formatNumber(t.metrics[metric]) || '–'}`
          )
      ),
      params &&
        h('div', { class: 'ftnb-params', 'data-testid': 'ftnb-lab-trial-params' }, params)
    );
  };
  return h('ul', { class: 'ftnb-trials', 'aria-label': 'Trials' }, rows.map(row));
}

/** What the Delete control shows and does. */
export interface DeleteControlOptions {
  name: string;
  /** Delete was clicked once: ask before deleting. */
  confirming: boolean;
  /** The server's refusal of the last try (a live experiment), or null. */
  refusal: string | null;
  ask(): void;
  cancel(): void;
  confirm(): void;
}

/** Delete…, which asks once ("Delete NAME with all its results and checkpoints?"). */
export function deleteControl(o: DeleteControlOptions): HTMLElement {
  if (!o.confirming) {
    return h(
      'div',
      { class: 'ftnb-delete' },
      h(
        'button',
        {
          class: 'ftnb-button',
          'data-testid': 'ftnb-lab-delete',
          title: 'Delete this experiment with all its results and checkpoints (asks first)',
          onclick: o.ask
        },
        'Delete…'
      ),
      o.refusal &&
        h('div', { class: 'ftnb-error', 'data-testid': 'ftnb-lab-delete-refused' }, o.refusal)
    );
  }
  return h(
    'div',
    { class: 'ftnb-delete ftnb-confirm', role: 'alertdialog', 'aria-label': `Delete ${o.name}?` },
    h('div', {}, `Delete ${o.name} with all its results and checkpoints? This cannot be undone.`),
    h(
      'button',
      { class: 'ftnb-button', 'data-testid': 'ftnb-lab-delete-confirm', onclick: o.confirm },
      'Delete'
    ),
    h(
      'button',
      { class: 'ftnb-button', 'data-testid': 'ftnb-lab-delete-cancel', onclick: o.cancel },
      'Cancel'
    )
  );
}
