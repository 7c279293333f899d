/**
 * ftnb's JupyterLab extension: the experiments panel in the left sidebar, over the server
 * extension's routes (ftnb/lab/handlers.py).
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { LabIcon } from '@jupyterlab/ui-components';

import { FtnbApi } from './api';
import { ExperimentsPanel } from './panel';

import iconSvg from '../style/icon.svg';

/** The sidebar's icon: a line chart with a restart mark. */
export const ftnbIcon = new LabIcon({ name: 'ftnb:experiments', svgstr: iconSvg });

// Notebook commands of JupyterLab's notebook extension: they act on the notebook that was
// focused last, so this extension needs no import of @jupyterlab/notebook.
const INSERT_BELOW = 'notebook:insert-cell-below';
const REPLACE_SELECTION = 'notebook:replace-selection';
const RUN_CELL = 'notebook:run-cell';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'ftnb-jupyterlab:plugin',
  description: 'Experiments under the storage roots: trials, failures, charts and controls.',
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    const panel = new ExperimentsPanel(new FtnbApi(app.serviceManager.serverSettings), {
      runInNotebook: async (source: string) => {
        if (!app.commands.isEnabled(INSERT_BELOW)) {
          return false;
        }
        await app.commands.execute(INSERT_BELOW);
        await app.commands.execute(REPLACE_SELECTION, { text: source });
        await app.commands.execute(RUN_CELL);
        return true;
      }
    });
    panel.title.icon = ftnbIcon;
    app.shell.add(panel, 'left', { rank: 600 });
  }
};

export default plugin;
