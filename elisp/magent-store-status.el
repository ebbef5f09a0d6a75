;;; magent-store-status.el --- The state of the magent-store backend, in a buffer  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; M-x magent-store-status shows what the backend and the shim know:
;; the backend's pid, port and uptime, its open sessions and pending
;; events, its flush times and the time Emacs waited for each flush to
;; be acknowledged, compactions, the last error, the restarts, and
;; whatever `magent-store-status-functions' add (the adapter to magent
;; adds its view of the loaded magent and what failed in it).

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'magent-store)

(defun magent-store-status--percentile (numbers p)
  "Return the P-th percentile (P an integer, 0 to 100) of NUMBERS, or nil.
Linear interpolation between the closest ranks, as the backend and
`magent-store report' compute it: the median is P = 50, and a higher
P never gives less."
  (when numbers
    (let* ((sorted (sort (copy-sequence numbers) #'<))
           (rank (* (1- (length sorted)) p))
           (low (nth (/ rank 100) sorted))
           (rest (% rank 100)))
      (if (zerop rest)
          low
        (+ low (/ (* (- (nth (1+ (/ rank 100)) sorted) low) rest) 100.0))))))

(defun magent-store-status--ms (value)
  "Return VALUE, a number of milliseconds or nil, as short text."
  (if (numberp value) (format "%.1f" value) "-"))

(defvar magent-store-status-functions nil
  "Functions of no argument returning more lines for `magent-store-status'.")

;;;###autoload
(defun magent-store-status ()
  "Show the backend's state in a buffer."
  (interactive)
  (let* ((backend magent-store-current-backend)
         (status (and backend
                      (ignore-errors
                        (json-parse-string (magent-store-call "status" nil)
                                           :object-type 'alist
                                           :null-object nil))))
         (ms magent-store-flush-ms))
    (with-current-buffer (get-buffer-create "*magent-store-status*")
      (let ((inhibit-read-only t))
        (erase-buffer)
        (if (not backend)
            (insert "Backend: not running\n")
          (insert (format "Backend pid:        %s\n"
                          (magent-store-backend-pid backend))
                  (format "Port:               %s\n"
                          (magent-store-backend-port backend))
                  (format "This machine:       %s\n"
                          (or (alist-get 'machine status) "-"))
                  (format "Other machines:     %s conflict copies merged, %s forks made\n"
                          (or (alist-get 'conflict-copies-merged status) 0)
                          (or (alist-get 'forks-made status) 0))
                  (format "Uptime:             %.0f s\n"
                          (- (float-time)
                             (magent-store-backend-started-at backend)))
                  (format "Open sessions:      %s\n"
                          (let ((open (alist-get 'open-sessions status)))
                            (if (> (length open) 0)
                                (mapconcat #'identity open " ")
                              "none")))
                  (format "Pending events:     %s\n"
                          (alist-get 'pending-events status))
                  (format "Flushes:            %s\n"
                          (alist-get 'flushes status))
                  (let ((bytes (alist-get 'bytes-written status)))
                    (format "Bytes written:      %s\n"
                            (if (numberp bytes)
                                (format "%d (%s)" bytes
                                        (file-size-human-readable bytes 'iec " "))
                              "-")))
                  (if (alist-get 'flush-ms-last status)
                      (format "Flush (backend):    last %s, median %s, p99 %s ms\n"
                              (magent-store-status--ms (alist-get 'flush-ms-last status))
                              (magent-store-status--ms (alist-get 'flush-ms-p50 status))
                              (magent-store-status--ms (alist-get 'flush-ms-p99 status)))
                    "Flush (backend):    no flush yet\n")
                  ;; Replies to the flushes the timer sends (ticks) are delayed
                  ;; up to a second to save Emacs wakeups: not a latency.
                  (if ms
                      (format "Acknowledged after: last %s, median %s, p99 %s ms \
\(the timer's flushes are acknowledged within 1 s, together)\n"
                              (magent-store-status--ms (car ms))
                              (magent-store-status--ms (magent-store-status--percentile ms 50))
                              (magent-store-status--ms (magent-store-status--percentile ms 99)))
                    "Acknowledged after: no flush yet\n")
                  (format "Compactions:        %s\n"
                          (alist-get 'compactions status))
                  ;; The disk is nearly full: the sessions have it first.
                  (let ((paused (alist-get 'search-index-paused status)))
                    (format "Search index:       %s\n"
                            (if (> (length paused) 0)
                                (mapconcat #'identity paused "\n                    ")
                              "kept current")))))
        (insert (format "Last error:         %s\n"
                        (or magent-store-last-error
                            (and status (alist-get 'last-error status))
                            "none"))
                (pcase magent-store-stops
                  ('nil "Restarts:           none\n")
                  (`(,count ,time ,why)
                   (format "Restarts:           %d, last at %s: the backend %s\n"
                           count (format-time-string "%F %T" time) why)))
                (format "Backend log:        %s\n"
                        (expand-file-name "server.log"
                                          (magent-store-log-directory))))
        (dolist (function magent-store-status-functions)
          (insert (or (ignore-errors (funcall function)) "")))
        (special-mode))
      (display-buffer (current-buffer)))))

(provide 'magent-store-status)
;;; magent-store-status.el ends here
