;;; magent-store-text-tests.el --- Non-ASCII text on the wire, unibyte and multibyte  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Everything Emacs sends the backend must arrive as the text it was,
;; whichever Emacs made it: since Emacs 30 `json-serialize' returns
;; unibyte UTF-8, which `prin1' writes as octal escapes.  One test per
;; kind of thing that crosses the wire (events, chunks, headers, scopes
;; and roots, large batches through the spool file, the load file read
;; back), each against the real backend.  `make test-elisp' runs them on
;; the host's Emacs, `make test-emacs30' on Emacs 30.

;;; Code:

(require 'ert)
(require 'json)
(require 'magent-store-tests)

(defconst magent-store-text-test--text
  (concat "漢字かな 한국어"              ; CJK
          " e\u0301 n\u0303"             ; combining marks
          " 😀👩‍💻"                      ; emoji, a ZWJ sequence
          " \u2028 \u2029"               ; line and paragraph separators
          " é \"q\" back\\slash \\303\\251 \\\\ \t\n")
  "Text with what has broken serializers, and escapes that must stay text.")

(defun magent-store-text-test--bytes (text)
  "Return TEXT as a unibyte string of its UTF-8 bytes."
  (encode-coding-string text 'utf-8-unix))

(defun magent-store-text-test--turn-started (turn-id input)
  "Return a turn-started event alist for TURN-ID whose input is INPUT."
  (magent-store-test--event
   "turn-started" :turn-id turn-id
   ;; A copy: the turn's conses are partly the helper's own constants.
   :payload `((turn . ,(let ((turn (copy-alist (magent-store-test--turn turn-id))))
                         (setf (alist-get 'input turn) input)
                         turn)))))

(defun magent-store-text-test--inputs (session-id &optional scope)
  "Return the inputs of SESSION-ID's turns under SCOPE, read back by load."
  (mapcar (lambda (turn) (alist-get 'input turn))
          (alist-get 'turns (plist-get (magent-store-load session-id scope)
                                       :snapshot))))

(ert-deftest magent-store-text-features-are-checked-once ()
  "The load-time check says what `json-serialize' returns here."
  (should magent-store-json--native)
  (should (eq magent-store-json--unibyte
              (not (multibyte-string-p (json-serialize ["\u00e9"])))))
  ;; Whatever this Emacs does, the shim's JSON is text.
  (should (multibyte-string-p (magent-store-json-encode '((a . "é")))))
  (should (equal (magent-store-json-encode '((a . "é"))) "{\"a\":\"é\"}"))
  (should (equal (magent-store-json-arg (json-serialize '((a . "é"))))
                 "{\"a\":\"é\"}"))
  (should (equal (magent-store-json-encode "é") "\"é\"")))

(ert-deftest magent-store-json-false-is-one-marker-both-ways ()
  "False is `:json-false' (magent's marker) in what Emacs sends and reads."
  (should (equal (magent-store-json-encode '((a . :json-false) (b . :null) (c . t)))
                 "{\"a\":false,\"b\":null,\"c\":true}"))
  (magent-store-test--with-backend
    (magent-store-open "s-false")
    (magent-store-append-event
     "s-false" (magent-store-text-test--turn-started
                "turn-1" '((flag . :json-false) (on . t))))
    (magent-store-flush "s-false")
    (should (equal (magent-store-text-test--inputs "s-false")
                   '(((flag . :json-false) (on . t)))))))

(ert-deftest magent-store-text-events-of-every-encoder ()
  "Events as alists, unibyte strings in them, and JSON text of both encoders."
  (let ((text magent-store-text-test--text)
        (magent-store-last-error nil))
    (magent-store-test--with-backend
      (magent-store-open "s-events")
      (magent-store-append-event "s-events"
                                 (magent-store-test--event "thread-started"))
      ;; 1. an alist holding multibyte text
      (magent-store-append-event
       "s-events" (magent-store-text-test--turn-started "turn-1" text))
      ;; 2. an alist holding the text's bytes (refused by native JSON on 30)
      (magent-store-append-event
       "s-events" (magent-store-text-test--turn-started
                   "turn-2" (magent-store-text-test--bytes text)))
      ;; 3. JSON text from `json-serialize' (unibyte since Emacs 30)
      (magent-store-append-event
       "s-events" (json-serialize
                   (magent-store-text-test--turn-started "turn-3" text)))
      ;; 4. JSON text from `json-encode' (multibyte)
      (magent-store-append-event
       "s-events" (let ((json-null :null) (json-false :false))
                    (json-encode
                     (magent-store-text-test--turn-started "turn-4" text))))
      ;; 5. an Emacs without native JSON: the shim's `json-encode' path
      (let ((magent-store-json--native nil))
        (magent-store-append-event
         "s-events" (magent-store-text-test--turn-started "turn-5" text)))
      (should (= (magent-store-flush "s-events") 6))
      (should-not magent-store-last-error)
      (should (equal (magent-store-text-test--inputs "s-events")
                     (make-list 5 text))))))

(ert-deftest magent-store-text-chunks-unibyte-multibyte-and-raw-bytes ()
  "Chunks arrive as their text; bytes that are not UTF-8 become U+FFFD."
  (let ((text magent-store-text-test--text))
    (magent-store-test--with-backend
      (magent-store-open "s-chunks")
      (magent-store-test--start-turn "s-chunks")
      (magent-store-append-item-content "s-chunks" "item-1" text)
      (magent-store-append-item-content
       "s-chunks" "item-1" (magent-store-text-test--bytes text))
      ;; A lone byte of a unibyte string, a raw byte in a multibyte one.
      (magent-store-append-item-content "s-chunks" "item-1" "a\377b")
      (magent-store-append-item-content
       "s-chunks" "item-1" (concat "é" (string-to-multibyte "\300") "漢"))
      ;; Octal-looking text right after bytes must stay text.
      (magent-store-append-item-content
       "s-chunks" "item-1" (concat (magent-store-text-test--bytes "é")
                                   "\\303 \\\\"))
      (magent-store-append-item-content "s-chunks" "item-1" text t)
      (should (= (magent-store-flush "s-chunks") 9))
      (let* ((snapshot (plist-get (magent-store-load "s-chunks") :snapshot))
             (item (aref (alist-get 'items (aref (alist-get 'turns snapshot) 0))
                         0)))
        (should (equal (alist-get 'content item)
                       (concat text text "a\ufffdb" "é\ufffd漢" "é\\303 \\\\")))
        (should (equal (alist-get 'output item) text))))))

;; Characters Emacs has and UTF-8 has not: a lone surrogate, one beyond
;; Unicode, one of Emacs's own.
(defconst magent-store-text-test--not-unicode
  (string ?a #xD800 ?b #x110000 ?c #x3FFF00 ?d)
  "Text holding characters that have no UTF-8.")

(ert-deftest magent-store-text-characters-beyond-unicode-become-u+fffd ()
  "Characters UTF-8 has no room for become U+FFFD; the session goes on saving."
  (let ((odd magent-store-text-test--not-unicode)
        (magent-store-last-error nil))
    (dolist (threshold (list magent-store-file-threshold 0)) ; wire, spool file
      (magent-store-test--with-backend
        (let ((magent-store-file-threshold threshold))
          (magent-store-open "s-odd")
          (magent-store-append-event "s-odd"
                                     (magent-store-test--event "thread-started"))
          (magent-store-append-event
           "s-odd" (magent-store-text-test--turn-started "turn-1" odd))
          (magent-store-append-event
           "s-odd" (magent-store-test--event
                    "item-started" :turn-id "turn-1" :item-id "item-1"
                    :payload `((item . ,(magent-store-test--item
                                         "item-1" "turn-1")))))
          (magent-store-append-item-content "s-odd" "item-1" odd)
          (should (= (magent-store-flush "s-odd") 4))
          (magent-store-append-item-content "s-odd" "item-1" "!")
          (should (= (magent-store-flush "s-odd") 5))
          (should-not magent-store-last-error)
          (let ((turn (aref (alist-get 'turns (plist-get (magent-store-load "s-odd")
                                                         :snapshot))
                            0)))
            (should (equal (alist-get 'input turn) "a\ufffdb\ufffdc\ufffdd"))
            (should (equal (alist-get 'content (aref (alist-get 'items turn) 0))
                           "a\ufffdb\ufffdc\ufffdd!"))))))))

(ert-deftest magent-store-text-large-batch-through-the-spool-file ()
  "The spool file carries the same text as the wire."
  (let ((text magent-store-text-test--text)
        (magent-store-file-threshold 0))
    (magent-store-test--with-backend
      (magent-store-open "s-spool")
      (magent-store-append-event "s-spool"
                                 (magent-store-test--event "thread-started"))
      (magent-store-append-event
       "s-spool" (json-serialize
                  (magent-store-text-test--turn-started "turn-1" text)))
      (magent-store-append-event
       "s-spool" (magent-store-text-test--turn-started
                  "turn-2" (magent-store-text-test--bytes text)))
      (should (= (magent-store-flush "s-spool") 3))
      (should (equal (magent-store-text-test--inputs "s-spool")
                     (list text text))))))

(ert-deftest magent-store-text-headers ()
  "Headers as alists, unibyte fields and JSON text keep their text."
  (let ((text magent-store-text-test--text))
    (magent-store-test--with-backend
      (magent-store-open "s-header")
      (dolist (header (list `((id . "s-header") (title . ,text))
                            `((id . "s-header")
                              (title . ,(magent-store-text-test--bytes text)))
                            (json-serialize `((id . "s-header") (title . ,text)))))
        (magent-store-put-header "s-header" header)
        (magent-store-flush "s-header")
        (should (equal (alist-get 'title (plist-get (magent-store-load "s-header")
                                                    :header))
                       text))
        (magent-store-put-header "s-header" '((id . "s-header") (title . "x")))
        (magent-store-flush "s-header")))))

(ert-deftest magent-store-text-scopes-and-roots ()
  "Roots and project scopes with non-ASCII names, multibyte or encoded."
  (magent-store-test--with-backend
    (let* ((name "项目 e\u0301 😀 \u2028 é")
           (project (expand-file-name name magent-store-root))
           (magent-store-last-error nil)
           (magent-store-root (expand-file-name "根 root é" magent-store-root)))
      (dolist (scope (list project (magent-store-text-test--bytes project)))
        (let ((id (if (multibyte-string-p scope) "s-scope-text" "s-scope-bytes")))
          (should (equal (magent-store-open id scope) 0))
          (magent-store-append-event id (magent-store-test--event "thread-started"))
          (magent-store-put-header id `((id . ,id) (scope . "project")
                                        (project-root . ,project)
                                        (title . ,name)))
          (should (= (magent-store-flush id) 1))
          (let ((loaded (magent-store-load id scope)))
            (should (equal (alist-get 'project-root (plist-get loaded :header))
                           project))
            (should (equal (alist-get 'title (plist-get loaded :header)) name)))))
      ;; Under the non-ASCII root, in the project's own directory.
      (should (= (length (directory-files
                          (expand-file-name "projects" magent-store-root)
                          nil "\\`[0-9a-f]\\{40\\}\\'"))
                 1)))))

(ert-deftest magent-store-text-through-the-mode ()
  "The adapter opens a non-ASCII project and forwards non-ASCII events."
  (let ((text magent-store-text-test--text))
    (magent-store-test--with-backend
      (let* ((project (expand-file-name "项目 😀" magent-store-root))
             (magent-store-last-error nil)
             (thread (list :session-id "s-mode-text" :scope project))
             (item (list :id "item-1"))
             (magent-store-test--calls nil))
        (unwind-protect
            (progn
              (magent-store-mode 1)
              (magent-thread-append-event
               thread (magent-store-test--event "thread-started"))
              (magent-thread-append-event
               thread (magent-store-text-test--turn-started "turn-1" text))
              (magent-thread-append-event
               thread (magent-store-test--event
                       "item-started" :turn-id "turn-1" :item-id "item-1"
                       :payload `((item . ,(magent-store-test--item
                                            "item-1" "turn-1")))))
              (magent-thread-append-item-content thread item text)
              (magent-thread-append-item-content
               thread item (magent-store-text-test--bytes text))
              (should (= (magent-store-flush "s-mode-text") 5))
              (should-not magent-store-last-error)
              (let* ((snapshot (plist-get (magent-store-load "s-mode-text" project)
                                          :snapshot))
                     (turn (aref (alist-get 'turns snapshot) 0)))
                (should (equal (alist-get 'input turn) text))
                (should (equal (alist-get 'content
                                          (aref (alist-get 'items turn) 0))
                               (concat text text)))))
          (magent-store-mode -1))))))

(provide 'magent-store-text-tests)
;;; magent-store-text-tests.el ends here
