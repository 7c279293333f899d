/**
 * The server extension's routes (`<base_url>ftnb/api/...`, documented in ftnb/lab/handlers.py),
 * called through `ServerConnection.makeRequest`, which adds the token and echoes the `_xsrf`
 * cookie in `X-XSRFToken` on POSTs.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { ExperimentSummary, ResultsUpdate, Snapshot } from './model';

/** A route's error: its HTTP status and the server's message. */
export class FtnbApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

/** The client of ftnb's server routes. */
export class FtnbApi {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  /** The configured storage roots. */
  async roots(): Promise<string[]> {
    return (await this.get<{ roots: string[] }>('roots')).roots;
  }

  /** The experiments in one root. */
  async experiments(root: string): Promise<ExperimentSummary[]> {
    return (await this.get<{ experiments: ExperimentSummary[] }>('experiments', { root }))
      .experiments;
  }

  /** An experiment's snapshot (the read model's JSON). */
  experiment(path: string): Promise<Snapshot> {
    return this.get<Snapshot>('experiment', { path });
  }

  /** One metric's rows after those already seen (`since`: rows per trial). */
  results(
    path: string,
    metric: string | null,
    since: Record<string, number>
  ): Promise<ResultsUpdate> {
    const query: Record<string, string> = { path, since: JSON.stringify(since) };
    if (metric) {
      query.metric = metric;
    }
    return this.get<ResultsUpdate>('results', query);
  }

  /** Stop the experiment (it ends INTERRUPTED, resumable). */
  stop(path: string): Promise<unknown> {
    return this.post('stop', { path });
  }

  /** Stop one trial, named by its id. */
  stopTrial(path: string, trialId: string): Promise<unknown> {
    return this.post('stop_trial', { path, trial_id: trialId });
  }

  /** Resume an interrupted experiment in a new supervisor. */
  resume(path: string): Promise<unknown> {
    return this.post('resume', { path });
  }

  private get<T>(route: string, query: Record<string, string> = {}): Promise<T> {
    const url =
      URLExt.join(this.settings.baseUrl, 'ftnb', 'api', route) + URLExt.objectToQueryString(query);
    return this.request<T>(url, { method: 'GET' });
  }

  private post<T>(route: string, body: object): Promise<T> {
    const url = URLExt.join(this.settings.baseUrl, 'ftnb', 'api', route);
    return this.request<T>(url, { method: 'POST', body: JSON.stringify(body) });
  }

  private async request<T>(url: string, init: RequestInit): Promise<T> {
    const response = await ServerConnection.makeRequest(url, init, this.settings);
    const text = await response.text();
    let data: any = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const message =
        (data && typeof data.message === 'string' && data.message) ||
        `${init.method} ${url}: HTTP ${response.status}`;
      throw new FtnbApiError(response.status, message);
    }
    return data as T;
  }
}
