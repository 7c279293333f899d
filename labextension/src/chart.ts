/** The panel's chart: a small SVG of one metric per trial, colored by JupyterLab's theme. */

import { svg } from './dom';
import { ChartData, chartLayout, formatNumber } from './model';

/** Line colors from JupyterLab's theme variables (light and dark), cycled over the trials. */
const COLORS = [
  'var(--jp-brand-color1)',
  'var(--jp-warn-color1)',
  'var(--jp-success-color1)',
  'var(--jp-error-color1)',
  'var(--jp-info-color1)',
  'var(--jp-brand-color3)',
  'var(--jp-warn-color3)',
  'var(--jp-success-color3)'
];

/** The chart of `data` as an SVG element (empty axes and a note when there is nothing yet). */
export function renderChart(data: ChartData, log: boolean, width = 300, height = 160): SVGElement {
  const layout = chartLayout(data.series, { width, height, log });
  const left = 44;
  const bottom = height - 20;
  return svg(
    'svg',
    {
      class: 'ftnb-chart',
      'data-testid': 'ftnb-lab-chart',
      'data-lines': layout.lines.filter(l => l.points > 0).length,
      'data-points': layout.lines.reduce((n, l) => n + l.points, 0),
      viewBox: `0 0 ${width} ${height}`,
      width: '100%',
      role: 'img',
      'aria-label': `${data.metric ?? 'metric'} per training iteration`
    },
    svg('line', { class: 'ftnb-chart-axis', x1: left, y1: 8, x2: left, y2: bottom }),
    svg('line', { class: 'ftnb-chart-axis', x1: left, y1: bottom, x2: width - 8, y2: bottom }),
    layout.yTicks.map(t =>
      svg(
        'text',
        { class: 'ftnb-chart-tick', x: left - 4, y: t.pos + 3, 'text-anchor': 'end' },
        formatNumber(t.value)
      )
    ),
    layout.xTicks.map(t =>
      svg(
        'text',
        { class: 'ftnb-chart-tick', x: t.pos, y: height - 6, 'text-anchor': 'middle' },
        formatNumber(t.value)
      )
    ),
    layout.lines.map(l =>
      svg(
        'path',
        {
          class: 'ftnb-chart-line',
          d: l.d || 'M0 0',
          stroke: COLORS[l.color % COLORS.length],
          'data-trial-id': l.trial_id,
          'data-points': l.points
        },
        svg('title', {}, `${l.label || l.trial_id} (${l.trial_id})`)
      )
    )
  );
}
