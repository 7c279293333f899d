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

/** What a conditional GET last received: its `ETag` and its parsed body. */
interface Tagged {
  etag: string;
  data: unknown;
}

/** How many answers are kept for conditional GETs (each root's list, the experiments seen
 * last). */
const MAX_TAGGED = 16;

/** What `request` returns for a 304. */
const NOT_MODIFIED = Symbol('not modified');

/** The client of ftnb's server routes. */
export class FtnbApi {
  /** Bytes of response bodies received, and conditional GETs answered 304 (no body). */
  readonly traffic = { bodyBytes: 0, notModified: 0 };
  private readonly tagged = new Map<string, Tagged>();

  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  /** The configured storage roots. */
  async roots(): Promise<string[]> {
    return (await this.getTagged<{ roots: string[] }>('roots')).roots;
  }

  /** The experiments in one root: polled with `If-None-Match`, so an unchanged listing is a
   * 304 without a body and the last one received is returned again. */
  async experiments(root: string): Promise<ExperimentSummary[]> {
    return (await this.getTagged<{ experiments: ExperimentSummary[] }>('experiments', { root }))
      .experiments;
  }

  /** An experiment's snapshot (the read model's JSON); conditional, as `experiments`. */
  experiment(path: string): Promise<Snapshot> {
    return this.getTagged<Snapshot>('experiment', { path });
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

  /** Remove an ended experiment's folder (refused, 409, while a live driver owns it). */
  delete(path: string): Promise<unknown> {
    return this.post('delete', { path });
  }

  private url(route: string, query: Record<string, string> = {}): string {
    return (
      URLExt.join(this.settings.baseUrl, 'ftnb', 'api', route) + URLExt.objectToQueryString(query)
    );
  }

  private get<T>(route: string, query: Record<string, string> = {}): Promise<T> {
    return this.request<T>(this.url(route, query), { method: 'GET' });
  }

  /** A GET that sends back the `ETag` of the last answer: on 304, that answer again. */
  private async getTagged<T>(route: string, query: Record<string, string> = {}): Promise<T> {
    const url = this.url(route, query);
    const last = this.tagged.get(url);
    const headers: Record<string, string> = last ? { 'If-None-Match': last.etag } : {};
    let etag: string | null = null;
    const data = await this.request<T>(url, { method: 'GET', headers }, response => {
      etag = response.headers.get('ETag');
      return response.status === 304 && last !== undefined;
    });
    if (data === NOT_MODIFIED && last) {
      this.traffic.notModified += 1;
      return last.data as T;
    }
    if (etag) {
      this.tagged.delete(url); // most recent last: the oldest is dropped first
      this.tagged.set(url, { etag, data });
      if (this.tagged.size > MAX_TAGGED) {
        this.tagged.delete(this.tagged.keys().next().value as string);
      }
    } else {
      this.tagged.delete(url);
    }
    return data as T;
  }

  private post<T>(route: string, body: object): Promise<T> {
    const url = URLExt.join(this.settings.baseUrl, 'ftnb', 'api', route);
    return this.request<T>(url, { method: 'POST', body: JSON.stringify(body) });
  }

  private async request<T>(
    url: string,
    init: RequestInit,
    notModified: (response: Response) => boolean = () => false
  ): Promise<T> {
    const response = await ServerConnection.makeRequest(url, init, this.settings);
    if (notModified(response)) {
      return NOT_MODIFIED as T;
    }
    const text = await response.text();
    this.traffic.bodyBytes += new TextEncoder().encode(text).length;
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
